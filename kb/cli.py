"""The `kb` command line: loads one module per command group from kb/commands and maps errors to exit codes."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from kb import __version__
from kb.errors import KBError

EPILOG = """exit codes:
  0  diagnosed / found / confirmed
  1  abstained or nothing found (repro: not confirmed; validate: a document failed)
  2  bad input (unreadable file, malformed config, unknown framework or category)
  3  unknown incident id
  4  kb diagnose --fail-on: the input matches a known failure at or above the threshold

shell completion:  eval "$(kb completion bash)"   (zsh: kb completion zsh)"""


def _global_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The flags every command accepts, before or after its name. On subcommands their default is
    SUPPRESS, so a flag given before the subcommand is not reset by the subcommand's parser."""
    d = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("--data-dir", help="index + store folder (env KB_DATA_DIR; default: user cache dir)", **d)
    p.add_argument("--incidents-dir", help="curated incidents folder (env KB_INCIDENTS_DIR)", **d)
    p.add_argument("--model", help="embedding model: a packaged name or a local sentence-transformers path "
                                   "(env KB_EMBED_MODEL)", **d)
    p.add_argument("--lang", choices=["en", "zh"], help="output language (default: the input's language, "
                                                        "else KB_LANG / the locale)", **d)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or chatter", **d)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb", description="Diagnose NaN / inf / collapsing losses in LLM training.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kb {__version__}")
    _global_options(p, suppress=False)
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
    for name, sp in sub.choices.items():
        if name != "completion":
            _global_options(sp, suppress=True)
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
        from kb.commands._common import err

        err().print(f"kb: error: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        print("kb: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
