"""Toolkits on top of the core for operator developers (hierarchies, etc.)."""
