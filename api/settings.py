"""Server settings read from the environment (prefix KB_), one typed object passed to the app."""

from __future__ import annotations

import posixpath
import re
from functools import cached_property
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kb.settings import Limits


def _csv(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


class Settings(Limits):
    """Every knob of the HTTP layer, on top of the library's own limits (kb.settings.Limits);
    `KB_MAX_LOG_BYTES=1000000 kb serve` sets `max_log_bytes`."""

    model_config = SettingsConfigDict(env_prefix="KB_", extra="ignore", frozen=False)

    # Library location (None: the library's own defaults, which also read KB_DATA_DIR / KB_INCIDENTS_DIR).
    data_dir: str | None = None
    incidents_dir: str | None = None
    embed_model: str | None = None

    # Write endpoints (ingest, repro) need one of these keys; comma-separated. Empty: writes are refused.
    api_keys: str = ""
    # When true, read endpoints need a key too (a private deployment).
    require_key_for_reads: bool = False

    # Input limits. The body limit is enforced while the body streams in; the others after decoding.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    max_log_bytes: int = Field(default=5 * 1024 * 1024, ge=1)
    max_log_lines: int = Field(default=100_000, ge=1)
    max_config_bytes: int = Field(default=256 * 1024, ge=1)
    max_question_chars: int = Field(default=4000, ge=1)
    max_ingest_bytes: int = Field(default=2 * 1024 * 1024, ge=1)
    max_k: int = Field(default=50, ge=1)
    max_page_size: int = Field(default=200, ge=1)

    # Repro jobs run in this process's worker threads; more than `repro_max_pending` waiting jobs get 429.
    repro_concurrency: int = Field(default=1, ge=1)
    repro_max_pending: int = Field(default=16, ge=1)
    repro_timeout_s: int = Field(default=300, ge=1)
    # Checks run with these limits (RLIMIT_AS in MB; not applied when a CUDA device may be used).
    repro_memory_mb: int = Field(default=4096, ge=256)

    # Admission control per worker process: diagnoses (and chat answers) running at once, waiting beyond them,
    # and how long one may wait; past that 503 with Retry-After.
    max_inflight: int = Field(default=2, ge=1)
    max_queued: int = Field(default=8, ge=0)
    queue_wait_s: float = Field(default=10.0, gt=0)
    retry_after_s: int = Field(default=5, ge=1)
    # /v1/ask has its own lane: an answer costs a few ms, so a deep queue drains in well under a second and
    # asks are never turned away because diagnoses hold the slots (nor the reverse).
    ask_max_inflight: int = Field(default=2, ge=1)
    ask_max_queued: int = Field(default=64, ge=0)
    ask_queue_wait_s: float = Field(default=2.0, gt=0)
    # How often (ms) a thread that holds the GIL is asked to hand it over. Diagnoses are CPU-bound Python in
    # worker threads; the event loop that answers /healthz and queues requests needs the GIL between them.
    gil_switch_ms: float = Field(default=0.5, gt=0, le=100)
    # Slow clients: a request's headers (enforced by the uvicorn protocol, api.server) and its whole body
    # (enforced by the body middleware) must arrive within these.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Replay cache of signed chat requests (SQLite under the data dir, shared by the workers of one host).
    replay_cache_rows: int = Field(default=200_000, ge=1000)

    # Build/load the index at startup so the first question is not slow; readyz is 503 until it is done.
    warm_on_start: bool = True

    # Chat-ops: Slack
    slack_signing_secret: str = ""
    slack_bot_token: str = ""
    slack_api_base: str = "https://slack.com/api"
    # response_url targets the server may POST to (scheme://host[:port]/path-prefix), comma-separated.
    slack_response_url_allow: str = "https://hooks.slack.com/"
    slack_max_skew_s: int = 300

    # Chat-ops: Feishu / Lark
    feishu_verification_token: str = ""
    feishu_encrypt_key: str = ""
    feishu_app_id: str = ""
    feishu_app_secret: str = ""
    feishu_api_base: str = "https://open.feishu.cn"  # https://open.larksuite.com for Lark
    feishu_max_skew_s: int = 3600

    # Chat-ops: DingTalk outgoing robot
    dingtalk_app_secret: str = ""
    # DingTalk's sign covers only the timestamp; the shorter the window, the less a captured pair is worth.
    dingtalk_max_skew_s: int = 300

    chatops_max_results: int = Field(default=3, ge=1, le=10)
    chatops_timeout_s: float = 10.0

    @cached_property
    def api_key_list(self) -> list[str]:
        return _csv(self.api_keys)

    @cached_property
    def slack_response_url_prefixes(self) -> list[str]:
        return _csv(self.slack_response_url_allow)

    def allowed_response_url(self, url: str) -> str | None:
        """The normalised form of `url` when it lies under one allowed prefix (same scheme, host and port, path
        at or below the prefix's), else None. Post to the returned URL, never the raw one: the check and the
        request must see the same path."""
        u = normalise_url(url)
        if u is None:
            return None
        target = urlsplit(u)
        for prefix in self.slack_response_url_prefixes:
            p = normalise_url(prefix)
            if p is None:
                continue
            allowed = urlsplit(p)
            if target.netloc != allowed.netloc or target.scheme != allowed.scheme:
                continue
            base = allowed.path if allowed.path.endswith("/") else allowed.path + "/"
            if target.path == allowed.path or target.path.startswith(base):
                return u
        return None

    def response_url_allowed(self, url: str) -> bool:
        return self.allowed_response_url(url) is not None


_DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters that need no percent-encoding in a path (RFC 3986 unreserved + sub-delims + ':' '@' '/').
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def normalise_url(url: str) -> str | None:
    """An http(s) URL in one canonical spelling, or None when it cannot be trusted as a target.

    Lower-cases scheme and host, drops the default port, decodes percent-encoded characters and re-encodes them
    one way, and resolves dot-segments (`/hooks/../admin` -> `/admin`, `%2e%2e` included). Refused: other schemes,
    user-info (`https://hooks.slack.com@evil/`), backslashes, control characters, encoded slashes (`%2f`) and
    NUL, which HTTP clients and servers read differently."""
    if not isinstance(url, str) or len(url) > 2048 or re.search(r"[\x00-\x20\x7f\\]", url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host or "@" in parts.netloc or "%" in host:
        return None
    if re.search(r"%(2f|5c|00)", parts.path, re.IGNORECASE):
        return None
    try:
        path = unquote(parts.path, errors="strict") if parts.path else "/"
    except UnicodeDecodeError:
        return None
    resolved = posixpath.normpath(path) if path not in ("", "/") else "/"
    if resolved.startswith("//"):
        resolved = "/" + resolved.lstrip("/")
    if path.endswith("/") and not resolved.endswith("/"):
        resolved += "/"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, quote(resolved, safe=_PATH_SAFE), parts.query, ""))
