"""Cryptography for Trellis: identities, secure aggregation primitives and audit chains (no ML)."""
