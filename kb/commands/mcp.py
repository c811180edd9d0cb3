"""`kb mcp`: serve the diagnose / ask / show / repro tools to coding assistants over MCP (stdio)."""

from __future__ import annotations

from kb.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("mcp", help="Model Context Protocol server on stdio (for coding assistants)",
                       description="Speaks MCP on stdin/stdout; tools: diagnose, ask, show_incident, run_repro. "
                                   "Register it in your assistant as the command `kb mcp`.")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        from api.mcp_server import run_stdio
    except ImportError as e:
        raise InputError(f"kb mcp needs the mcp package: pip install 'kb-nan[mcp]' ({e})") from None
    run_stdio(args.data_dir, args.incidents_dir, args.model)
    return 0
