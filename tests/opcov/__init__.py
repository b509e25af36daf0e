"""Operator-coverage ("breadth") test support: a table of single-op cases and their exporter."""
