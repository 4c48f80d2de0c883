"""``tetherctl completion bash|zsh|fish``: shell completion generated from tetherctl's own parser.

The parser becomes five small tables, keyed by the command path (``tetherctl env apply``): its
sub-commands, its options, the options that take a value, each option's choices and the choices of
its positional arguments. Each shell gets the same short walk over the words typed so far: follow
the sub-commands, skip option values, then offer what fits where the cursor is (files for an
option's value without choices).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SHELLS = ("bash", "zsh", "fish")
_WORD = re.compile(r"^[A-Za-z0-9_.:@%+/=-]+$")  # words that need no quoting in any of the shells


@dataclass
class Tables:
    """What each shell looks up: ``kind`` -> key -> words (``kind`` one of ``KINDS``)."""

    data: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def add(self, kind: str, key: str, words: list[str]) -> None:
        words = [w for w in words if _WORD.match(w)]
        if words:
            self.data.setdefault(kind, {}).setdefault(key, []).extend(words)

    def entries(self) -> Iterator[tuple[str, str, str]]:
        for kind in sorted(self.data):
            for key, words in sorted(self.data[kind].items()):
                yield kind, key, " ".join(words)


def tables(parser: argparse.ArgumentParser, path: str = "tetherctl") -> Tables:
    """The completion tables of ``parser`` and every parser below it."""
    out = Tables()
    _walk(parser, path, out)
    return out


def _walk(parser: argparse.ArgumentParser, path: str, out: Tables) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choices: dict[str, argparse.ArgumentParser] = action.choices
            out.add("subs", path, list(choices))
            for name, sub in choices.items():
                _walk(sub, f"{path} {name}", out)
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            out.add("opts", path, list(action.option_strings))
            if action.nargs != 0:
                out.add("valued", path, list(action.option_strings))
                for flag in action.option_strings:
                    out.add("choices", f"{path} {flag}", [str(c) for c in action.choices or ()])
        elif action.choices:
            out.add("args", path, [str(c) for c in action.choices])


def _case_table(t: Tables) -> str:
    """The lookup as a POSIX ``case`` (bash and zsh alike)."""
    lines = ["_tetherctl_data() {", '    case "$1:$2" in']
    lines += [f'        "{kind}:{key}") echo "{words}" ;;' for kind, key, words in t.entries()]
    lines += ["    esac", "}"]
    return "\n".join(lines)


_WALK = """\
    local cmdpath="tetherctl" pending="" w i
    for ((i = FIRST; i < LAST; i++)); do
        w="${WORDS[i]}"
        if [[ -n $pending ]]; then
            pending=""
        elif [[ $w == -* ]]; then
            if [[ $w != *=* && " $(_tetherctl_data valued "$cmdpath") " == *" $w "* ]]; then
                pending="$w"
            fi
        elif [[ " $(_tetherctl_data subs "$cmdpath") " == *" $w "* ]]; then
            cmdpath="$cmdpath $w"
        fi
    done
    local cands
    if [[ -n $pending ]]; then
        cands="$(_tetherctl_data choices "$cmdpath $pending")"
        if [[ -z $cands ]]; then
            FILES
            return
        fi
    elif [[ $cur == -* ]]; then
        cands="$(_tetherctl_data opts "$cmdpath")"
    else
        cands="$(_tetherctl_data subs "$cmdpath") $(_tetherctl_data args "$cmdpath")"
    fi
"""


def bash(t: Tables) -> str:
    walk = (
        _WALK.replace("FIRST", "1")
        .replace("LAST", "COMP_CWORD")
        .replace("WORDS", "COMP_WORDS")
        .replace("FILES", 'COMPREPLY=($(compgen -f -- "$cur"))')
    )
    return (
        "# bash completion for tetherctl: source <(tetherctl completion bash)\n"
        f"{_case_table(t)}\n\n"
        "_tetherctl() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}"\n'
        f"{walk}"
        '    COMPREPLY=($(compgen -W "$cands" -- "$cur"))\n'
        "}\n"
        "complete -F _tetherctl tetherctl\n"
    )


def zsh(t: Tables) -> str:
    walk = (
        _WALK.replace("FIRST", "2")
        .replace("LAST", "CURRENT")
        .replace("WORDS", "words")
        .replace("FILES", "_files")
    )
    return (
        "#compdef tetherctl\n"
        "# zsh completion for tetherctl: source <(tetherctl completion zsh), after compinit\n"
        f"{_case_table(t)}\n\n"
        "_tetherctl() {\n"
        '    local cur="${words[CURRENT]}"\n'
        f"{walk}"
        "    compadd -- ${=cands}\n"
        "}\n"
        'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then\n'
        '    _tetherctl "$@"\n'
        "else\n"
        "    compdef _tetherctl tetherctl\n"
        "fi\n"
    )


def fish(t: Tables) -> str:
    table = ["function __tetherctl_data", '    switch "$argv[1]:$argv[2]"']
    for kind, key, words in t.entries():
        table += [f"        case '{kind}:{key}'", f"            echo '{words}'"]
    table += ["    end", "end"]
    return (
        "# fish completion for tetherctl: tetherctl completion fish | source\n"
        + "\n".join(table)
        + """

function __tetherctl_words
    string split -n ' ' -- (__tetherctl_data $argv)
end

function __tetherctl_candidates
    set -l typed (commandline -opc)
    set -l cur (commandline -ct)
    set -l cmdpath tetherctl
    set -l pending ''
    for w in $typed[2..-1]
        if test -n "$pending"
            set pending ''
        else if string match -q -- '-*' $w
            if not string match -q -- '*=*' $w; and contains -- $w (__tetherctl_words valued $cmdpath)
                set pending $w
            end
        else if contains -- $w (__tetherctl_words subs $cmdpath)
            set cmdpath "$cmdpath $w"
        end
    end
    if test -n "$pending"
        set -l c (__tetherctl_words choices "$cmdpath $pending")
        if test (count $c) -eq 0
            __fish_complete_path $cur
            return
        end
        printf '%s\\n' $c
    else if string match -q -- '-*' $cur
        __tetherctl_words opts $cmdpath
    else
        __tetherctl_words subs $cmdpath
        __tetherctl_words args $cmdpath
    end
end

complete -c tetherctl -f -a '(__tetherctl_candidates)'
"""
    )


SCRIPTS: dict[str, Callable[[Tables], str]] = {"bash": bash, "zsh": zsh, "fish": fish}


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "completion",
        help="print a shell completion script (bash: source <(tetherctl completion bash))",
        description="Print a completion script for tetherctl. bash: source <(tetherctl completion bash); "
        "zsh (after compinit): source <(tetherctl completion zsh); fish: tetherctl completion fish | source",
    )
    c.add_argument("shell", choices=SHELLS)

    def command(args: argparse.Namespace) -> int:
        sys.stdout.write(SCRIPTS[args.shell](tables(root)))
        return 0

    c.set_defaults(func=command, offline=True)
