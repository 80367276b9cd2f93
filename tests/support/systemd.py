"""systemd unit and environment files as systemd reads them, for tests of the units Trellis
ships (deploy/systemd/) and writes (an onboarding kit's)."""

from __future__ import annotations

import configparser
import re
import shlex


def unit_sections(text: str, source: str = "<unit>") -> configparser.ConfigParser:
    """A unit file's sections; a key given twice keeps its last value, as systemd reads most."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str      # type: ignore[assignment,method-assign]  # keys keep case
    parser.read_string(text, source=source)
    return parser


def environment_file(text: str) -> dict[str, str]:
    """KEY=value lines of an EnvironmentFile (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def exec_start(unit: configparser.ConfigParser, env: dict[str, str]) -> list[str]:
    """ExecStart as systemd runs it: ${KEY} one word, $KEY split at whitespace."""
    argv: list[str] = []
    for word in shlex.split(unit["Service"]["ExecStart"]):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        split = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv.append(env[whole.group(1)])
        elif split:
            argv.extend(env[split.group(1)].split())
        else:
            argv.append(word)
    return argv
