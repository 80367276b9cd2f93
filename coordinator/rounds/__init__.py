"""Round logic, pure: the round machine and its stages, each algorithm's strategy, GCFL's
clustering. No sockets, no files, no clocks of its own (STYLE.md 1).

May import: ``trellis.protos`` and ``trellis.crypto``; never gRPC, serving, state, operations,
simulation or the command line.
"""
