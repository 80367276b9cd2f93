"""What a silo's operator reads: its status, its per-round figures, its Prometheus metrics and the
report of what left the silo, all from the silo's own files.

May import: ``trellis.silo.training`` and the layers under it; never the federation protocol or
the command line.
"""
