"""What the coordinator's operator and reviewers read: status, the progress log, results reports
and the compliance report, from a running service or its state folder.

May import: ``trellis.coordinator.state``, ``trellis.coordinator.rounds``, ``trellis.protos``
and ``trellis.crypto``; never serving, simulation or the command line.
"""
