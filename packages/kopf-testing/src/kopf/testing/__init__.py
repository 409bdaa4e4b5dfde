"""
Tools for testing operators: ``KopfRunner`` and an in-process Kubernetes API emulator.
"""
