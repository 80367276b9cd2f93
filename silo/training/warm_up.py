"""What a silo loads before it joins, so that its first round does not wait on imports.

A silo learns its plan when it joins, and only then builds its trainer; the coordinator opens
round 1 as soon as every silo has joined, and each stage has a deadline. torch.optim imports
``torch._dynamo`` the first time an optimiser is built and stepped (about a second of CPU, several
on a loaded machine): paid there, it can push a silo past round 1's first deadline, which drops it
and costs the round a retry. Paid here, before joining, it costs the same once and nothing later.
"""

from __future__ import annotations

import torch


def warm_up_optimisers() -> None:
    """One Adam step on a throwaway parameter: torch.optim's lazy imports, done now."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    parameter.grad = torch.zeros(1)
    torch.optim.Adam([parameter]).step()
