"""Placeholder: see issues 3 and 6."""
