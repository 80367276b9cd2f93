"""One-process simulation, sequential or on Ray: the same round machine, strategies, silo
sessions and trainers as a real federation, without the network.

The one place that sits above both sides: it may import ``trellis.silo`` as well as the
coordinator's rounds, state and operations; never serving or the command line.
"""
