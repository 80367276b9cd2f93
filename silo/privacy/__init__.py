"""What a silo agrees to and what it spends: the operator's policy (which plans it joins), its
differential-privacy demands and budget, the per-graph clipped gradients and noise of DP-SGD,
and a membership-inference audit.

May import: ``trellis.silo.models``, ``trellis.silo.data``, ``trellis.protos`` and
``trellis.crypto``; never training, the federation protocol, operations or the command line.
"""
