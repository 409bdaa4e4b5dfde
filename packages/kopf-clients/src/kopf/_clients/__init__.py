"""The async Kubernetes API client of kopf-clients, built on aiohttp."""
