"""`ollie completion bash|zsh|fish`: a completion script for the shell, made from the parser itself,
so it offers every command and option `ollie` has (and the choices of those that have some).

    source <(ollie completion bash)          # ~/.bashrc
    source <(ollie completion zsh)           # ~/.zshrc
    ollie completion fish > ~/.config/fish/completions/ollie.fish
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

SHELLS = ("bash", "zsh", "fish")


def register(sub: Any) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh, fish)")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=_completion)


def _completion(args: argparse.Namespace) -> int:
    from . import build_parser

    commands = _commands(build_parser())
    sys.stdout.write({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](commands))
    return 0


Option = tuple[list[str], str, list[str], bool]  # flags, help, choices, takes a value


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, list[Option]]]:
    """Each command (and `""`, ollie itself): its help and its options."""
    found: dict[str, tuple[str, list[Option]]] = {"": ("", _options(parser))}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found[name] = (helps.get(name, ""), _options(sub))
    return found


def _options(parser: argparse.ArgumentParser) -> list[Option]:
    options = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        choices = [str(c) for c in action.choices or ()]
        if action.option_strings:
            options.append((list(action.option_strings), action.help or "", choices, action.nargs != 0))
        elif choices:  # a positional with choices (`keys set|list|rm`)
            options.append(([], action.help or "", choices, True))
    return options


def bash(commands: dict[str, tuple[str, list[Option]]]) -> str:
    names = " ".join(n for n in commands if n)
    cases = []
    for name, (_, options) in commands.items():
        if not name:
            continue
        flags = " ".join(f for flags, _, _, _ in options for f in flags)
        words = " ".join(c for flags, _, choices, _ in options if not flags for c in choices)
        valued = [(flags, choices) for flags, _, choices, _ in options if flags and choices]
        values = "".join(
            f"            {'|'.join(flags)}) {_compgen(' '.join(choices))}; return;;\n" for flags, choices in valued
        )
        cases.append(
            f"        {name})\n"
            f'            case "$prev" in\n{values}            esac\n'
            f"            if [[ $cur == -* ]]; then {_compgen(flags)};\n"
            f"            else {_compgen(words)}; fi;;\n"
        )
    return (
        "# ollie completion for bash: source <(ollie completion bash)\n"
        "_ollie() {\n"
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]}\n"
        "    COMPREPLY=()\n"
        "    if [[ $COMP_CWORD -eq 1 ]]; then\n"
        f'        COMPREPLY=($(compgen -W {shlex.quote(names + " --help --version")} -- "$cur")); return\n'
        "    fi\n"
        '    case "$cmd" in\n' + "".join(cases) + "    esac\n"
        "}\n"
        "complete -o default -F _ollie ollie\n"
    )


def zsh(commands: dict[str, tuple[str, list[Option]]]) -> str:
    """zsh runs the bash script through its bashcompinit layer, as many tools' scripts do."""
    return (
        "# ollie completion for zsh: source <(ollie completion zsh)\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(commands).split("\n", 1)[1]
    )


def fish(commands: dict[str, tuple[str, list[Option]]]) -> str:
    names = " ".join(n for n in commands if n)
    lines = [
        "# ollie completion for fish: ollie completion fish > ~/.config/fish/completions/ollie.fish",
        "complete -c ollie -f",
    ]
    for name, (help_text, options) in commands.items():
        if not name:
            continue
        first = shlex.quote("not __fish_seen_subcommand_from " + names)
        lines.append(f"complete -c ollie -n {first} -a {name} -d {_fish_quote(help_text)}")
        when = shlex.quote(f"__fish_seen_subcommand_from {name}")
        for flags, help_text, choices, takes in options:
            if not flags:
                lines.append(f"complete -c ollie -n {when} -a {shlex.quote(' '.join(choices))}")
                continue
            parts = [f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in flags]
            value = f" -r -a {shlex.quote(' '.join(choices))}" if choices else (" -r -F" if takes else "")
            lines.append(f"complete -c ollie -n {when} {' '.join(parts)}{value} -d {_fish_quote(help_text)}")
    return "\n".join(lines) + "\n"


def _compgen(words: str) -> str:
    return f'COMPREPLY=($(compgen -W {shlex.quote(words)} -- "$cur"))'


def _fish_quote(text: str) -> str:
    return shlex.quote(text.replace("%%", "%").splitlines()[0] if text else "")
