"""The prepared-dataset folder format: the in-memory values every source returns, and the folder
that ``silo data prepare`` writes and training reads.

May import what ``trellis.silo.data`` may import (numpy, torch, torch_geometric, the protos and
crypto packages); never the models, training, privacy, federation, operations or command line.
"""
