"""The silo's side of the federation protocol: the session state machine (no I/O), the driver
that acts on each instruction through a link, the gRPC link and the agent behind ``silo join``.

May import: every silo layer under it (operations, training, privacy, models, data),
``trellis.protos`` and ``trellis.crypto``; never the command line.
"""
