"""Command-line mistakes as a user makes them, in real processes: one line, exit 2 (issue 34, 6).

An address without a port, a plan that is not UTF-8, a NUL byte in a path the plan names, help
read through a pipe: each was a traceback, a Python message or a cut word before.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup

from trellis.protos.cli_edge import guard_bad_input

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "plan.example.toml"


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_serve_with_a_listen_address_without_a_port_says_host_port(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    shutil.copy(EXAMPLE, plan)
    line = _one_error_line(_run("trellis.coordinator.cli", "serve", "--plan", str(plan),
                                "--listen", "127.0.0.1"))
    assert "--listen '127.0.0.1': expected host:port" in line and "int()" not in line


@pytest.mark.parametrize("command", [("trellis.coordinator.cli", "serve"),
                                     ("trellis.coordinator.cli", "simulate")])
def test_a_plan_that_is_not_utf8_is_one_line(tmp_path: Path, command: tuple[str, str]) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_bytes(EXAMPLE.read_bytes().replace(b'"chem-consortium"', b'"chem-\xff"'))
    result = _run(*command, "--plan", str(plan))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "not UTF-8 text: byte 0xff at line 6" in result.stderr


def test_a_nul_byte_in_a_path_of_the_plan_is_refused_naming_the_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(EXAMPLE.read_text().replace('state_dir = "state"',
                                                'state_dir = "st\\u0000ate"'))
    result = _run("trellis.coordinator.cli", "serve", "--plan", str(plan))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "server.state_dir: contains a NUL byte" in result.stderr


def test_a_policy_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_bytes(b"[accept]\nmax_rounds = 5 # \xfe\n")
    line = _one_error_line(_run("trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1",
                                "--data", str(tmp_path), "--identity", str(tmp_path),
                                "--policy", str(policy)))
    assert "not UTF-8 text" in line and "line 2" in line


def _app(fail_with: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def read(path: Path) -> None:
        raise fail_with

    return app


@pytest.mark.parametrize(("error", "said"), [
    (ValueError("embedded null byte"), "a path contains a NUL byte"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8 text"),
])
def test_the_edge_turns_bad_bytes_anywhere_into_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], error: BaseException, said: str) -> None:
    command = typer.main.get_command(_app(error))
    with pytest.raises(SystemExit) as done:
        guard_bad_input(lambda: command.main(["x"], standalone_mode=True))()
    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and said in line


def test_other_value_errors_are_not_mistaken_for_bad_bytes() -> None:
    command = typer.main.get_command(_app(ValueError("something else")))
    with pytest.raises(ValueError, match="something else"):
        guard_bad_input(lambda: command.main(["x"], standalone_mode=True))()


def _help_tokens(command: Any) -> set[str]:
    tokens: set[str] = set()
    for param in command.params:
        tokens.update(param.opts)
        tokens.update(str(getattr(param, "help", "") or "").split())
    return {t for t in tokens if len(t) > 2}


@pytest.mark.parametrize("command", [("trellis.coordinator.cli", "serve"),
                                     ("trellis.silo.cli", "join")])
def test_help_through_a_pipe_cuts_no_word(command: tuple[str, str]) -> None:
    module, name = command
    result = _run(module, name, "--help")
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout, result.stdout
    if module.startswith("trellis.coordinator"):
        from trellis.coordinator.cli.app import app
    else:
        from trellis.silo.cli.app import app
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    # Each word of the help text, and each flag, is whole on one line of the output.
    words = set(re.split(r"[\s│]+", result.stdout))
    missing = {t for t in _help_tokens(group.commands[name])
               if t not in words and t.rstrip(".,;") not in words}
    assert not missing, result.stdout
