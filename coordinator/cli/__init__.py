"""The ``coordinator`` command line: one module per command group, each a typer application.

May import every other part of the coordinator (the simulation only lazily, inside
``coordinator simulate``); nothing imports it but the entry point.
"""

from trellis.coordinator.cli.app import main

__all__ = ["main"]
