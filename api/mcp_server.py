"""`kb mcp`: a Model Context Protocol server over stdio, so coding assistants can diagnose, ask, read and repro."""

from __future__ import annotations

import difflib
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from kb.errors import KBError

INSTRUCTIONS = """kb diagnoses NaN / inf / collapsing losses in LLM fine-tuning and RLHF (SFT, DPO, KTO, ORPO, SimPO,
reward models, PPO/GRPO) from a pasted training log, config or command line. Call `diagnose` with what the
user pasted; when the result lists `questions`, ask the user them and call `diagnose` again with the same paste
and their replies as `answers` (`{fact: value}`, e.g. {"precision": "bf16"}): the ranking is redone with them;
`ask` for a short question; `show_incident` for the full record of an id; `run_repro` to check on
real PyTorch whether the mechanism reproduces and whether the user's settings trigger it."""


class _KB:
    """The knowledge base, opened on the first tool call (the index may need building) and then kept."""

    def __init__(self, data_dir: str | None, incidents_dir: str | None, model: str | None) -> None:
        self.args = {"data_dir": data_dir, "incidents_dir": incidents_dir, "model": model}
        self._kb = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._kb is None:
                from kb.kb import KnowledgeBase

                # progress=False: stdout is the protocol channel and must carry nothing else.
                self._kb = KnowledgeBase.open(progress=False, **self.args)
            return self._kb


def _tool_error() -> type[Exception]:
    try:
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp.exceptions import ToolError
    return ToolError


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input reaches the assistant as a tool error with our message (the SDK hides other exceptions)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, KBError) as e:
            raise _tool_error()(str(e)) from None

    return wrapper


def _links(sources: list[str]) -> list[str]:
    return [s for s in sources if s.startswith(("https://", "http://"))]


def _unknown_id(kb, incident_id: str) -> ValueError:
    close = difflib.get_close_matches(incident_id, list(kb.records), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `ask` lists ids"
    return ValueError(f"unknown incident {incident_id!r}{hint}")


def build_server(data_dir: str | None = None, incidents_dir: str | None = None, model: str | None = None):
    """The MCP server with its four tools (works with the mcp SDK 2.x `MCPServer` and 1.x `FastMCP`)."""
    try:
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:
        from mcp.server.fastmcp import FastMCP as Server

    from kb import __version__ as kb_version

    state = _KB(data_dir, incidents_dir, model)
    try:
        server = Server("kb", instructions=INSTRUCTIONS, version=kb_version)
    except TypeError:  # mcp 1.x FastMCP takes no version
        server = Server("kb", instructions=INSTRUCTIONS)

    @server.tool()
    @_guard
    def diagnose(text: str = "", log: str = "", config: str = "", question: str = "", k: int = 3,
                 answers: dict[str, str | int | float | bool] | None = None) -> dict[str, Any]:
        """Diagnose why a training loss went NaN / inf / to zero. `text`: anything pasted (log, config, command
        line, prose; mixed is fine); or give `log`, `config` and `question` separately. Returns the ranked
        root-cause categories with calibrated confidence, the evidence lines (1-based, in the input they name),
        the fix and a repro command; `abstained` is true when nothing known fits. When unsure it lists
        `questions` (`fact`, `question`, `options`): pass the user's replies as `answers` ({fact: value}) with the
        same paste and the ranking is redone with them."""
        if not any(x.strip() for x in (text, log, config, question)):
            raise ValueError("nothing to diagnose: pass text (a log, config or command line) or a question")
        if answers and (len(answers) > 32 or any(len(str(key)) > 100 or len(str(v)) > 200
                                                 for key, v in answers.items())):
            raise ValueError("answers: at most 32, with short keys and values")
        kb = state.get()
        fields = {"text": text, "log": log, "config": config, "question": question}
        res = kb.diagnose(**{f: v for f, v in fields.items() if v.strip()}, k=max(1, min(int(k), 10)),
                          answers=dict(answers) if answers else None)
        return res.model_dump(mode="json")

    @server.tool()
    @_guard
    def ask(question: str, k: int = 5, framework: str = "", algorithm: str = "", category: str = "") -> dict[str, Any]:
        """Search the curated incidents with a short question in English or Chinese (e.g. "DPO NLL loss nan").
        Optional filters: framework (trl, ms-swift, ...), algorithm (DPO, KTO, SFT, ...), category."""
        if not question.strip():
            raise ValueError("empty question")
        kb = state.get()
        filters = {k_: v for k_, v in (("framework", framework), ("algorithm", algorithm), ("category", category))
                   if v.strip()}
        res = kb.ask(question, k=max(1, min(int(k), 20)), filters=filters or None)
        out = res.model_dump(mode="json")
        for r in out["results"]:
            r["sources"] = _links(r["sources"])
        return out

    @server.tool()
    @_guard
    def show_incident(incident_id: str, lang: str = "en") -> dict[str, Any]:
        """The full record of one incident: symptoms, root cause, fix with steps, affected / fixed versions,
        the settings that trigger it, links to the public threads and its repro command. lang: en or zh."""
        kb = state.get()
        if incident_id not in kb.records:
            raise _unknown_id(kb, incident_id)
        inc = kb.get(incident_id)
        pick = (lambda b: b.zh or b.en) if lang == "zh" else (lambda b: b.en or b.zh)
        return {
            "id": inc.id, "title": pick(inc.title), "summary": pick(inc.summary),
            "category": inc.root_cause.category, "status": inc.root_cause.status,
            "root_cause": pick(inc.root_cause.explanation),
            "fix": pick(inc.fix.summary), "fix_steps": [pick(s) for s in inc.fix.steps],
            "framework": inc.framework.name, "affected_versions": inc.framework.affected_versions,
            "fixed_versions": inc.framework.fixed_versions, "algorithm": inc.algorithm,
            "precision": inc.precision, "config": inc.config,
            "sources": _links([s.url for s in inc.sources]), "repro": kb.repro_command(inc),
            "details": pick(inc.body),
        }

    @server.tool()
    @_guard
    def run_repro(incident_id: str, config: str = "", settings: dict[str, Any] | None = None, device: str = "cpu",
                  timeout_s: float = 180.0) -> dict[str, Any]:
        """Run an incident's repro check (real PyTorch on tiny tensors / a tiny model, seconds on CPU): does the
        faulty setting reproduce the failure and does the fix remove it? Pass the user's `config` text (YAML,
        JSON, command line) or `settings` ({key: value}) to learn whether *their* settings trigger it
        (`user_settings_trigger`). device: cpu, cuda or auto."""
        from kb.repro import runner, user

        kb = state.get()
        if incident_id not in kb.records:
            raise _unknown_id(kb, incident_id)
        import importlib.util

        try:
            has_torch = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError, AttributeError):
            has_torch = False
        if not has_torch:
            raise ValueError("repro checks run PyTorch, which is not installed where kb runs "
                             "(pip install torch==2.13.0 for the CPU build, then pip install 'kb-nan[repro]')")
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError("device must be cpu, cuda or auto")
        facts: dict[str, Any] = {}
        if config.strip():
            facts.update(user.facts_from_text(config, source="config"))
        if settings:
            facts.update(user.facts_from_pairs([f"{k_}={v}" for k_, v in settings.items()]))
        verdict = runner.run_check(incident_id, kb.incidents_dir, device, facts=facts or None,
                                   timeout=max(1.0, min(float(timeout_s), 900.0)))
        out = verdict.model_dump(mode="json")
        out["confirmed"] = bool(verdict.reproduced and verdict.fixed)
        return out

    return server


def run_stdio(data_dir: str | None = None, incidents_dir: str | None = None, model: str | None = None) -> None:
    # A repro subprocess or a library warning must never write to our stdout (the JSON-RPC stream).
    os.environ.setdefault("TQDM_DISABLE", "1")
    build_server(data_dir, incidents_dir, model).run("stdio")
