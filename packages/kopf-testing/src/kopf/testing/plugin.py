"""The pytest plugin of kopf-testing: fixtures for operator tests (registered via an entry point)."""
