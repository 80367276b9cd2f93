"""The command lines that deploy/ files run, checked against this version's CLIs.

Kubernetes args, compose commands and systemd ExecStart lines name `coordinator` or `silo`
subcommands and options; nothing runs them until a cluster or a host does. These helpers parse
such a command line with the real CLI (an option it lacks, a value of the wrong kind or a
required option left out fails), and ask the real program's `--help` about every option.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import typer.main

PROGRAMS = ("coordinator", "silo")


def _split(argv: Sequence[str]) -> tuple[str, list[str], Any, list[str]]:
    """(program, subcommand path, the subcommand, its arguments) of a command line."""
    from trellis.coordinator.cli.app import app as coordinator_app
    from trellis.silo.cli.app import app as silo_app

    program = argv[0].rsplit("/", 1)[-1]
    assert program in PROGRAMS, f"{argv[0]!r} is neither {' nor '.join(PROGRAMS)}"
    # Typer's click (its own copy in recent versions): a group is what has subcommands.
    command: Any = typer.main.get_command(
        {"coordinator": coordinator_app, "silo": silo_app}[program])
    path: list[str] = []
    rest = list(argv[1:])
    while hasattr(command, "get_command"):
        assert rest, f"{' '.join(argv)}: no subcommand of {program} {' '.join(path)}"
        context = command.context_class(command, info_name=program)
        sub = command.get_command(context, rest[0])
        assert sub is not None, f"{program} has no subcommand {' '.join([*path, rest[0]])!r}"
        path.append(rest.pop(0))
        command = sub
    return program, path, command, rest


def parse_command(argv: Sequence[str]) -> dict[str, Any]:
    """The options `argv` gives its subcommand, parsed as the program parses them (click's
    UsageError, or BadParameter, on an option it lacks, a bad value or a missing one)."""
    program, path, command, rest = _split(argv)
    context = command.make_context(" ".join([program, *path]), rest)
    return dict(context.params)


def option_names(argv: Sequence[str]) -> list[str]:
    """The --options a command line gives (a `--name=value` counts as `--name`)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


@functools.cache
def help_text(program: str, *path: str) -> str:
    """What `program path... --help` prints, run as its own process."""
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", f"trellis.{program}.cli", *path, "--help"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def check_help_names_every_option(argv: Sequence[str]) -> None:
    """Every option of argv is one that the subcommand's own `--help` lists."""
    program, path, _, rest = _split(argv)
    text = help_text(program, *path)
    listed = set(re.findall(r"--[a-z0-9][a-z0-9-]*", text))
    missing = [name for name in option_names(rest) if name not in listed]
    assert not missing, f"`{program} {' '.join(path)} --help` lists no {', '.join(missing)}"


def check_command(argv: Sequence[str]) -> dict[str, Any]:
    """Both checks above; the parsed options."""
    params = parse_command(argv)
    check_help_names_every_option(argv)
    return params


def shell_commands(script: str, env: dict[str, str]) -> list[list[str]]:
    """The `coordinator` and `silo` command lines of a simple `sh -c` script (commands joined
    by `;`, `||`, `&&`, loops' `do`), its $VARIABLES from env where env has them."""
    found = []
    for piece in re.split(r";|\|\||&&", script):
        words = shlex.split(piece.strip())
        if words and words[0] == "do":
            words = words[1:]
        if words and words[0] in PROGRAMS:
            found.append([re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), word)
                          for word in words])
    return found


# What may stand before a program in a document's command line: sudo as the service's user,
# or compose running it in a service's container.
_PREFIX = re.compile(r"^(?:sudo -u \S+ |docker compose (?:exec|run --rm) \S+ )?")


def commands_in_text(text: str) -> list[list[str]]:
    """The `coordinator` and `silo` command lines of a README's indented lines (a trailing
    backslash continues a line; comments cut), each from its program's name on."""
    lines: list[str] = []
    pending = ""
    for line in text.splitlines():
        if pending or line.startswith(" "):
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            lines.append(pending)
            pending = ""
    found = []
    for line in lines:
        rest = _PREFIX.sub("", line, count=1)
        program = rest.split(" ", 1)[0]
        if program.rsplit("/", 1)[-1] in PROGRAMS:
            found.append(shlex.split(rest.split(" #", 1)[0]))
    return found
