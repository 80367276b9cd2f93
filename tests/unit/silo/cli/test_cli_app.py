"""The assembled `silo` application: every command and group its modules define is registered."""

from __future__ import annotations

import typer.core
import typer.main

from trellis.silo.cli.app import app


def _names(command: object) -> list[str]:
    """The sub-commands of a group, in the order `--help` lists them."""
    assert isinstance(command, typer.core.TyperGroup)
    return list(command.commands)


def test_the_root_lists_every_command_and_group_in_order() -> None:
    root = typer.main.get_command(app)
    assert _names(root) == ["join", "serve", "make-demo-data", "split-hetero", "split-tu",
                            "status", "predict", "pki", "audit", "jobs", "data"]


def test_the_groups_list_their_commands() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    assert _names(root.commands["pki"]) == ["request", "renew"]
    assert _names(root.commands["audit"]) == ["report"]
    assert _names(root.commands["jobs"]) == ["list", "show", "approve", "refuse"]
    assert _names(root.commands["data"]) == ["prepare", "inspect", "fingerprint"]
