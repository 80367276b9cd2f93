"""The error that ends a silo's part in a federation, whichever layer of the silo raises it.

The federation protocol (silo/federation/driver.py, agent.py) raises it when the coordinator
ends the federation or refuses the silo; local training on several processes
(silo/training/parallel_trainer.py) when one of the silo's processes fails. It lives here, under
both, because training may not import the federation protocol; ``silo join`` turns it into one
line and its exit code.
"""

from __future__ import annotations


class FederationFailed(RuntimeError):
    """The coordinator ended the federation without completing it, or refused this silo."""
