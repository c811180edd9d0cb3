"""The `kb` command line: loads one module per command group from kb/commands and maps errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from kb.errors import KBError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb", description="Diagnose NaN / inf / collapsing losses in LLM training.")
    p.add_argument("--data-dir", help="index + store folder (env KB_DATA_DIR; default: user cache dir)")
    p.add_argument("--incidents-dir", help="curated incidents folder (env KB_INCIDENTS_DIR; default: ./incidents)")
    p.add_argument("--model", help="embedding model: a packaged name or a local sentence-transformers path "
                                   "(env KB_EMBED_MODEL)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or chatter")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    import kb.commands as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"kb.commands.{mod.name}")
        except Exception as e:  # noqa: BLE001 - one broken optional command must not take down the rest
            print(f"kb: warning: command module {mod.name} unavailable: {e}", file=sys.stderr)
            continue
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KBError as e:
        print(f"kb: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("kb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
