"""
The admission webhook servers and tunnels: not implemented yet in this version of kopf-webhooks.

``kopf.WebhookServer`` and its siblings resolve here (lazily, via the ``kopf`` facade); until they exist,
an import explains it instead of failing with an obscure "no module" error.
"""
raise ImportError(
    'The admission webhook servers and tunnels (kopf.WebhookServer, kopf.WebhookAutoServer, '
    'kopf.WebhookNgrokTunnel, etc.) are not available yet: kopf-webhooks does not implement them '
    'in this version. The admission handlers (@kopf.on.validate/mutate) are accepted but not served.'
)
