"""Silo agent: data loaders, models, local training and the client side of the federation."""
