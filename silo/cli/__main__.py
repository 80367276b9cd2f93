"""`python -m trellis.silo.cli`: the same as the `silo` command."""

from trellis.silo.cli import main

main()
