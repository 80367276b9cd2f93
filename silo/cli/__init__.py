"""The ``silo`` command line: one module per command group, each a typer application.

May import every other part of the silo; nothing imports it but the entry point.
"""

from trellis.silo.cli.app import main

__all__ = ["main"]
