"""`python -m trellis.coordinator.cli`: the same as the `coordinator` command."""

from trellis.coordinator.cli import main

main()
