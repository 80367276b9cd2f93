"""What the coordinator keeps on disk for a federation: its checkpoint, the lock that makes it the
only coordinator of a state folder, and the results file.

May import: ``trellis.coordinator.rounds``, ``trellis.protos`` and ``trellis.crypto``.
"""
