"""Until kopf-webhooks implements them, the webhook servers say so (not an obscure "no module" error)."""
import pytest

import kopf


@pytest.mark.parametrize('name', ['WebhookServer', 'WebhookAutoServer', 'WebhookNgrokTunnel'])
def test_webhook_servers_explain_that_they_are_not_available_yet(name: str) -> None:
    with pytest.raises(ImportError, match=r'are not available yet: kopf-webhooks does not implement them'):
        getattr(kopf, name)
