"""The framework's internals: registries, handlers, the reactor and its engines."""
