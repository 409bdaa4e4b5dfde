"""
What operator developers declare: settings, handlers with their filters, registries, causes.

This layer holds data structures and pure decisions only (which handlers match which cause,
which cause an event is); it never talks to the API and never invokes the handlers themselves.
"""
