"""The running coordinator: the gRPC service (thin handlers over mTLS), the thread-safe core that
holds the round machine, health and metrics endpoints, and the guards that bound its memory.

May import: operations, state, rounds, pki, ``trellis.protos`` and ``trellis.crypto``; never the
simulation, the silo or the command line.
"""
