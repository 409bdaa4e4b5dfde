"""
The async Kubernetes API client of kopf-clients, built on aiohttp.

* ``errors``: the exceptions of the API, one class per meaningful HTTP status.
* ``vault``: the credentials with priorities, validity, re-login coordination, cached sessions.
* ``auth``: the HTTP session (TLS, authorization, proxies) for one credential.
* ``api``: the core request & stream functions: credentials, timeouts, retries, throttling.
* ``scanning``: the discovery of resources and namespaces.
* ``fetching``, ``watching``: reading, listing, and watching objects.
* ``creating``, ``patching``, ``deleting``: modifying objects.
* ``events``: posting Kubernetes events about objects.
* ``logins``: the login functions that produce the credentials (kubeconfig, service accounts, etc).

Only this package talks to the Kubernetes API; the rest of the framework uses these functions.
"""
