"""
The certificates verified as Kubernetes verifies them, on every Python version.

Python 3.13 has made ``ssl.create_default_context()`` verify with two more flags:
``VERIFY_X509_STRICT`` (the certificates must follow RFC 5280 themselves, e.g. a CA must have the key
usage extension) and ``VERIFY_X509_PARTIAL_CHAIN`` (any trusted certificate is an anchor of the chain,
not only a self-signed root). Kubernetes' own programs (kubectl, client-go, kube-apiserver: Go's
``crypto/x509``) trust their roots as given and ignore the key usage flags of the CAs, and the CAs of many
clusters (e.g. MicroK8s', or hand-made ones) have none: with Python 3.13's defaults, an operator that works
with kubectl and on Python 3.12 fails on 3.13 with "CA cert does not include key usage extension".

The contexts that this project makes for the Kubernetes API, its webhooks and its test servers verify the
chain up to a trusted certificate (its signatures, validity and purpose) and the host name as before,
with the same flags on every Python version: partial chains as in Go, no strictness beyond Go's.
The contexts given by the users (e.g. ``WebhookServer(context=...)``) are never changed.
"""
import ssl

__all__ = ['verify_as_kubernetes']


def verify_as_kubernetes(context: ssl.SSLContext) -> ssl.SSLContext:
    """Verify the peers' certificates as Kubernetes does, whatever the Python version (see the module)."""
    context.verify_flags = (context.verify_flags & ~ssl.VERIFY_X509_STRICT) | ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
