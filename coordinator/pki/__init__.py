"""Onboarding silos: the kit a new silo's operator receives with its certificate.

May import: ``trellis.protos`` and ``trellis.crypto``.
"""
