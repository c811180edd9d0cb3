"""Server settings read from the environment (prefix KB_), one typed object passed to the app."""

from __future__ import annotations

from functools import cached_property
from urllib.parse import urlsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _csv(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


class Settings(BaseSettings):
    """Every knob of the HTTP layer; `KB_MAX_LOG_BYTES=1000000 kb serve` sets `max_log_bytes`."""

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
    dingtalk_max_skew_s: int = 3600

    chatops_max_results: int = Field(default=3, ge=1, le=10)
    chatops_timeout_s: float = 10.0

    @cached_property
    def api_key_list(self) -> list[str]:
        return _csv(self.api_keys)

    @cached_property
    def slack_response_url_prefixes(self) -> list[str]:
        return _csv(self.slack_response_url_allow)

    def response_url_allowed(self, url: str) -> bool:
        """True when `url` lies under one allowed prefix: same scheme, host and port, path below it."""
        try:
            u = urlsplit(url)
            port = u.port
        except ValueError:
            return False
        for prefix in self.slack_response_url_prefixes:
            p = urlsplit(prefix)
            if (u.scheme, (u.hostname or "").lower(), port) != (p.scheme, (p.hostname or "").lower(), p.port):
                continue
            if u.path.startswith(p.path or "/"):
                return True
        return False
