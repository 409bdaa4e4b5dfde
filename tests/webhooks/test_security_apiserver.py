"""
The README's recipe on a real kube-apiserver: the API server presents a client certificate to the webhooks
(via ``--admission-control-config-file`` and its kubeconfig), the server requires it (``verify_mode``).

Each test runs its own control plane (~3 s): the flag is kube-apiserver's, fixed at its start.
"""
import base64
import pathlib
import ssl
from typing import Any

import kubernetes
import pytest
import yaml

import kopf
from kopf._core.intents.registries import OperatorRegistry
from kopf.testing import KopfRunner
from kopf.testing.apiserver import KubernetesControlPlane, pki

from .._waiting import wait_until

pytestmark = pytest.mark.real_apiserver

REPO = pathlib.Path(__file__).resolve().parents[2]
WAIT = 30.0


def admission_config(tmp_path: pathlib.Path, pair: pki.KeyPair) -> pathlib.Path:
    """kube-apiserver's admission configuration: the webhooks' client certificate for all hosts ('*')."""
    kubeconfig = {
        'apiVersion': 'v1', 'kind': 'Config',
        'users': [{'name': '*', 'user': {
            'client-certificate-data': base64.b64encode(pair.cert_pem).decode(),
            'client-key-data': base64.b64encode(pair.key_pem).decode(),
        }}],
    }
    (tmp_path / 'webhooks.kubeconfig').write_text(yaml.safe_dump(kubeconfig))
    plugin_config = {'apiVersion': 'apiserver.config.k8s.io/v1', 'kind': 'WebhookAdmissionConfiguration',
                     'kubeConfigFile': str(tmp_path / 'webhooks.kubeconfig')}
    config = {
        'apiVersion': 'apiserver.config.k8s.io/v1', 'kind': 'AdmissionConfiguration',
        'plugins': [{'name': name, 'configuration': plugin_config}
                    for name in ['ValidatingAdmissionWebhook', 'MutatingAdmissionWebhook']],
    }
    (tmp_path / 'admission.yaml').write_text(yaml.safe_dump(config))
    return tmp_path / 'admission.yaml'


@pytest.mark.parametrize('presented', [True, False], ids=['with-client-cert', 'without-client-cert'])
def test_api_server_is_let_in_only_with_its_client_certificate(
        k8s_control_plane_assets: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        presented: bool,
) -> None:
    ca = pki.CertificateAuthority.generate('webhook-clients')
    (tmp_path / 'ca.pem').write_bytes(ca.cert_pem)
    args = {'admission-control-config-file': str(admission_config(
        tmp_path, ca.issue_client_certificate('kube-apiserver')))} if presented else {}
    assets = k8s_control_plane_assets
    with KubernetesControlPlane(etcd_path=assets.etcd, kube_apiserver_path=assets.kube_apiserver,
                                apiserver_args=args) as control_plane:
        monkeypatch.setenv('KUBECONFIG', str(control_plane.kubeconfig_path))
        api = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
        crds = kubernetes.client.ApiextensionsV1Api(api)
        crd = yaml.safe_load((REPO / 'examples' / 'crd.yaml').read_text())
        crds.create_custom_resource_definition(crd)
        wait_until(lambda: any(c.type == 'Established' and c.status == 'True' for c in
                               crds.read_custom_resource_definition(crd['metadata']['name']).status.conditions
                               or []))

        registry = OperatorRegistry()
        peers: list[Any] = []

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.admission.server = kopf.WebhookServer(
                host='127.0.0.1', addr='127.0.0.1', port=0,
                verify_mode=ssl.CERT_REQUIRED, verify_cafile=tmp_path / 'ca.pem')
            settings.admission.managed = 'auto.kopf.dev'

        @kopf.on.validate('kopfexamples', registry=registry)
        def check(sslpeer: Any, **_: Any) -> None:
            peers.append(dict(pair for rdn in sslpeer['subject'] for pair in rdn)['commonName'])
            raise kopf.AdmissionError('Checked by the webhook.', code=422)

        custom = kubernetes.client.CustomObjectsApi(api)
        admission = kubernetes.client.AdmissionregistrationV1Api(api)
        with KopfRunner(['run', '--standalone', '-n', 'default'], registry=registry, timeout=WAIT) as runner:
            wait_until(lambda: [c for c in admission.list_validating_webhook_configuration().items
                                if c.metadata.name == 'auto.kopf.dev' and c.webhooks])
            with pytest.raises(kubernetes.client.ApiException) as refused:
                custom.create_namespaced_custom_object(
                    group='kopf.dev', version='v1', namespace='default', plural='kopfexamples',
                    body={'apiVersion': 'kopf.dev/v1', 'kind': 'KopfExample', 'metadata': {'name': 'kex'}})
        api.close()
    assert runner.exit_code == 0, runner.output
    if presented:
        assert refused.value.status == 422
        assert 'Checked by the webhook.' in (refused.value.body or '')
        assert peers == ['kube-apiserver']
    else:
        assert refused.value.status == 500  # the webhook's failure policy: Fail
        assert 'failed calling webhook' in (refused.value.body or '')
        assert peers == []
        assert 'presented no certificate, but verify_mode=CERT_REQUIRED' in runner.output
