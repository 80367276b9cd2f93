"""The assembled ``coordinator`` application: every command and group its modules define.

Each command group lives in a module of its own, registered by ``cli/app.py``; a registration
lost there would drop a command silently, so the names are pinned here, in `--help`'s order.
"""

from __future__ import annotations

import typer.main
from typer.core import TyperGroup

from trellis.coordinator.cli.app import app


def _group(path: tuple[str, ...] = ()) -> TyperGroup:
    group = typer.main.get_group(app)
    for name in path:
        sub = group.commands[name]
        assert isinstance(sub, TyperGroup), name
        group = sub
    return group


def test_the_root_lists_every_command_and_group_in_order() -> None:
    assert list(_group().commands) == ["serve", "simulate", "health", "status", "report", "pki",
                                       "audit", "jobs"]


def test_the_pki_and_audit_groups_keep_their_sub_commands() -> None:
    assert list(_group(("pki",)).commands) == ["init", "sign", "operator", "revoke", "list"]
    assert list(_group(("audit",)).commands) == ["verify", "cross-check", "report"]
    assert list(_group(("jobs",)).commands) == ["submit", "list", "show", "logs", "stop",
                                                "results"]
