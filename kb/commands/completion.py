"""`kb completion bash|zsh`: a shell completion script generated from the parser itself."""

from __future__ import annotations

import argparse

# Commands whose first positional is an incident id: the script completes it from `kb repro --list`.
_ID_COMMANDS = ("show", "repro")


def register(sub) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description='bash: eval "$(kb completion bash)" in ~/.bashrc; '
                                   'zsh: eval "$(kb completion zsh)" in ~/.zshrc')
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=run)


def _spec(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Subcommands, each one's options, and the fixed choices of options that have them."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    globals_ = sorted(o for a in parser._actions for o in a.option_strings)
    options = {"": globals_}
    choices: dict[str, list[str]] = {}
    for name, sp in sub.choices.items():
        options[name] = sorted(o for a in sp._actions for o in a.option_strings)
        for a in sp._actions:
            if a.choices and a.option_strings:
                for o in a.option_strings:
                    choices[o] = [str(c) for c in a.choices]
            elif a.choices and not a.option_strings and name == "completion":
                choices["completion"] = [str(c) for c in a.choices]
    for a in parser._actions:
        if a.choices and a.option_strings:
            for o in a.option_strings:
                choices[o] = [str(c) for c in a.choices]
    return sorted(sub.choices), options, choices


def bash_script(parser: argparse.ArgumentParser) -> str:
    commands, options, choices = _spec(parser)
    cases = "\n".join(f'        {name}) opts="{" ".join(opts)}" ;;' for name, opts in options.items() if name)
    choice_cases = "\n".join(f'        {opt}) COMPREPLY=($(compgen -W "{" ".join(vals)}" -- "$cur")); return ;;'
                             for opt, vals in choices.items() if opt.startswith("-"))
    return f"""# kb bash completion: eval "$(kb completion bash)"
_kb_complete() {{
    local cur prev cmd i opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$prev" in
{choice_cases}
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$cur" == -* ]]; then
            COMPREPLY=($(compgen -W "{" ".join(options[""])}" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "{" ".join(commands)}" -- "$cur"))
        fi
        return
    fi
    case "$cmd" in
{cases}
        *) opts="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ "$cmd" == "completion" ]]; then
        COMPREPLY=($(compgen -W "bash zsh" -- "$cur"))
    elif [[ " {" ".join(_ID_COMMANDS)} " == *" $cmd "* ]]; then
        COMPREPLY=($(compgen -W "$(kb repro --list 2>/dev/null)" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o default -F _kb_complete kb
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    # zsh runs bash completion functions through bashcompinit; one script to maintain.
    return ("# kb zsh completion: eval \"$(kb completion zsh)\"\n"
            "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(parser))


def run(args) -> int:
    from kb.cli import build_parser

    parser = build_parser()
    print(bash_script(parser) if args.shell == "bash" else zsh_script(parser), end="")
    return 0
