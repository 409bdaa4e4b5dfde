"""
The decorators that register handlers: ``@kopf.on.create(...)``, ``@kopf.on.startup()``, etc.
"""
