"""
Exec credential plugins: external commands that print short-lived credentials.

A kubeconfig user can name a command (``users[].user.exec``) instead of static credentials.
The command gets a description of the request in the ``KUBERNETES_EXEC_INFO`` environment
variable and prints an ``ExecCredential`` object (``client.authentication.k8s.io/v1`` or
``v1beta1``) with a bearer token or a client certificate, optionally with an expiration time.

Plugins can be slow or rate-limited (cloud CLIs), so their credentials are remembered in-process
until shortly before they expire; credentials without an expiration time are never remembered,
as there is no way to tell when they go stale.
"""
import dataclasses
import datetime
import json
import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kopf._cogs.structs.credentials import LoginError

SUPPORTED_API_VERSIONS = (
    'client.authentication.k8s.io/v1',
    'client.authentication.k8s.io/v1beta1',
)

# A plugin that waits for a browser or a terminal prompt would block the login forever otherwise.
EXEC_TIMEOUT_SECONDS = 60.0

# Remembered credentials are dropped this long before their expiration, so that a request does not
# start with credentials that die on the way to the server.
CACHE_EXPIRY_MARGIN = datetime.timedelta(seconds=10)

# Only the tail of a failed plugin's stderr goes into the error: enough to see its complaint.
STDERR_TAIL_CHARS = 1000


@dataclasses.dataclass(frozen=True)
class ExecPluginSpec:
    """
    What to run and how; equal specs share remembered credentials.

    ``origin`` (which kubeconfig user defined it) and ``install_hint`` are only for error messages.
    """

    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = dataclasses.field(repr=False)
    api_version: str
    cluster_info: str | None = dataclasses.field(default=None, repr=False)  # JSON, if requested.
    origin: str = dataclasses.field(default='', compare=False)
    install_hint: str | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def description(self) -> str:
        where = f' ({self.origin})' if self.origin else ''
        return f'the exec credential plugin {self.command!r}{where}'


@dataclasses.dataclass(frozen=True)
class ExecCredential:
    """The useful part of a plugin's answer. Secrets are kept out of the repr."""

    token: str | None = dataclasses.field(default=None, repr=False)
    certificate_data: bytes | None = dataclasses.field(default=None, repr=False)
    private_key_data: bytes | None = dataclasses.field(default=None, repr=False)
    expiration: datetime.datetime | None = None


_remembered: dict[ExecPluginSpec, ExecCredential] = {}
# Login functions run in threads; one lock also prevents two concurrent runs of the same plugin.
_lock = threading.Lock()


def parse_exec_spec(
        raw: Any,
        *,
        origin: str,
        base_dir: Path | None,
        cluster_info: Mapping[str, Any] | None,
) -> ExecPluginSpec:
    """
    Validate the ``exec`` section of a kubeconfig user and turn it into a runnable spec.

    A command with a directory part but not absolute (``./bin/plugin``) is taken relative
    to the kubeconfig file that defined it, as kubectl does; a bare name is looked up in PATH.
    ``cluster_info`` is passed to the plugin only if the section asks for it (provideClusterInfo).
    """
    if not isinstance(raw, Mapping):
        raise LoginError(f'The exec section of {origin} must be a mapping with a command.')

    command = raw.get('command')
    if not isinstance(command, str) or not command:
        raise LoginError(f'The exec section of {origin} has no command; set exec.command.')

    api_version = raw.get('apiVersion')
    if api_version not in SUPPORTED_API_VERSIONS:
        raise LoginError(
            f'The exec section of {origin} has apiVersion {api_version!r}, which is not supported; '
            f'use one of: {", ".join(SUPPORTED_API_VERSIONS)}.'
        )

    if raw.get('interactiveMode') == 'Always':
        raise LoginError(
            f'The exec plugin {command!r} of {origin} requires an interactive terminal '
            f'(interactiveMode: Always), which an operator does not have; '
            f'configure the plugin to work non-interactively.'
        )

    raw_args = raw.get('args') or []
    if not isinstance(raw_args, list) or not all(isinstance(arg, str) for arg in raw_args):
        raise LoginError(f'The exec.args of {origin} must be a list of strings.')

    raw_env = raw.get('env') or []
    env: list[tuple[str, str]] = []
    if not isinstance(raw_env, list):
        raise LoginError(f'The exec.env of {origin} must be a list of {{name, value}} mappings.')
    for index, item in enumerate(raw_env):
        if (not isinstance(item, Mapping)
                or not isinstance(item.get('name'), str)
                or not isinstance(item.get('value'), str)):
            raise LoginError(f'The exec.env[{index}] of {origin} must have a string name and value.')
        env.append((item['name'], item['value']))

    if base_dir is not None and os.path.dirname(command) and not os.path.isabs(command):
        command = str(base_dir / command)

    install_hint = raw.get('installHint')
    wants_cluster_info = bool(raw.get('provideClusterInfo')) and cluster_info is not None
    return ExecPluginSpec(
        command=command,
        args=tuple(raw_args),
        env=tuple(env),
        api_version=api_version,
        cluster_info=json.dumps(cluster_info, sort_keys=True) if wants_cluster_info else None,
        origin=origin,
        install_hint=install_hint if isinstance(install_hint, str) else None,
    )


def get_exec_credential(spec: ExecPluginSpec) -> ExecCredential:
    """Return the remembered credentials of this plugin if still fresh, or run it anew."""
    with _lock:
        remembered = _remembered.get(spec)
        now = datetime.datetime.now(datetime.UTC)
        if (remembered is not None and remembered.expiration is not None and
                now < remembered.expiration - CACHE_EXPIRY_MARGIN):
            return remembered
        _remembered.pop(spec, None)

        credential = run_exec_plugin(spec)
        if credential.expiration is not None:
            _remembered[spec] = credential
        return credential


def forget_exec_credentials() -> None:
    """
    Drop all remembered plugin credentials, so that the next login runs the plugins again.

    Useful when the server has rejected credentials before their declared expiration.
    """
    with _lock:
        _remembered.clear()


def run_exec_plugin(spec: ExecPluginSpec) -> ExecCredential:
    """Run the plugin once, with no caching, and parse its answer."""
    exec_info: dict[str, Any] = {
        'apiVersion': spec.api_version,
        'kind': 'ExecCredential',
        'spec': {'interactive': False},
    }
    if spec.cluster_info is not None:
        exec_info['spec']['cluster'] = json.loads(spec.cluster_info)
    env = dict(os.environ)
    env.update(spec.env)
    env['KUBERNETES_EXEC_INFO'] = json.dumps(exec_info)

    hint = f' {spec.install_hint.strip()}' if spec.install_hint else ''
    try:
        completed = subprocess.run(
            [spec.command, *spec.args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXEC_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise LoginError(
            f'Cannot run {spec.description}: the command is not found; '
            f'install it or fix the path in the kubeconfig.{hint}'
        ) from None
    except PermissionError:
        raise LoginError(
            f'Cannot run {spec.description}: permission denied; make the file executable.{hint}'
        ) from None
    except OSError as e:
        raise LoginError(f'Cannot run {spec.description}: {e.strerror or type(e).__name__}.{hint}') from None
    except subprocess.TimeoutExpired:
        raise LoginError(
            f'{_capitalized(spec.description)} did not finish in {EXEC_TIMEOUT_SECONDS:g} seconds; '
            f'check that it works non-interactively.'
        ) from None

    if completed.returncode != 0:
        stderr = completed.stderr.decode('utf-8', errors='replace').strip()
        details = f': {stderr[-STDERR_TAIL_CHARS:]}' if stderr else ' and printed nothing to stderr'
        raise LoginError(
            f'{_capitalized(spec.description)} failed with exit code {completed.returncode}{details}'
        )

    return _parse_exec_credential(completed.stdout, spec)


def _parse_exec_credential(stdout: bytes, spec: ExecPluginSpec) -> ExecCredential:
    # The output is never quoted into the errors: a half-valid answer can still hold a token.
    description = _capitalized(spec.description)
    try:
        payload = json.loads(stdout)
    except ValueError:
        raise LoginError(
            f'{description} printed {len(stdout)} bytes that are not valid JSON; '
            f'it must print an ExecCredential object to stdout.'
        ) from None
    if not isinstance(payload, dict) or payload.get('kind') != 'ExecCredential':
        raise LoginError(f'{description} printed JSON that is not an ExecCredential object.')
    if payload.get('apiVersion') != spec.api_version:
        raise LoginError(
            f'{description} answered with apiVersion {payload.get("apiVersion")!r}, '
            f'but {spec.api_version!r} was requested in the kubeconfig; make them match.'
        )

    status = payload.get('status')
    if not isinstance(status, dict):
        raise LoginError(f'{description} printed an ExecCredential without a status.')

    token = status.get('token')
    certificate = status.get('clientCertificateData')
    private_key = status.get('clientKeyData')
    for field, value in [('token', token), ('clientCertificateData', certificate),
                         ('clientKeyData', private_key)]:
        if value is not None and not isinstance(value, str):
            raise LoginError(f'{description} printed a non-string status.{field}.')
    if bool(certificate) != bool(private_key):
        raise LoginError(
            f'{description} printed only one of status.clientCertificateData and status.clientKeyData; '
            f'both are needed for a client certificate.'
        )
    if not token and not certificate:
        raise LoginError(
            f'{description} printed an ExecCredential with neither status.token '
            f'nor status.clientCertificateData.'
        )

    expiration: datetime.datetime | None = None
    raw_expiration = status.get('expirationTimestamp')
    if raw_expiration is not None:
        try:
            expiration = datetime.datetime.fromisoformat(str(raw_expiration))
        except ValueError:
            raise LoginError(
                f'{description} printed status.expirationTimestamp {raw_expiration!r}, '
                f'which is not an RFC 3339 time.'
            ) from None
        if expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=datetime.UTC)

    return ExecCredential(
        token=token or None,
        certificate_data=certificate.encode('utf-8') if certificate else None,
        private_key_data=private_key.encode('utf-8') if private_key else None,
        expiration=expiration,
    )


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]
