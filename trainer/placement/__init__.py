"""Placement: which worker trains what, and where variables live."""
