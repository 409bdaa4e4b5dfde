"""
Async primitives of the framework, free of its own types: flags, tasks, alarms, back-offs, capacities.

Shared by every distribution (the client, the core); they import nothing of the framework.
"""
