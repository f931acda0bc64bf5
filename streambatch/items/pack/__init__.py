"""Packed rows: documents packed best-fit into rows of context_length tokens."""
