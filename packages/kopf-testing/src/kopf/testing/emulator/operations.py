"""
The semantics of the API's write operations: create, update, patch, delete, and their consequences.

This is where the conventions of the Kubernetes API live: system-managed metadata, the status
subresource, ``metadata.generation``, finalizers and deletion timestamps, namespaces that must
exist, CRDs that register their resources, cascading deletion of namespace contents, of custom
objects of a deleted CRD, and of owned objects (garbage collection by ``ownerReferences``).

All decisions and commits are synchronous; the only awaits are the admission webhook calls,
after which the object is re-checked and the operation retried if it was changed meanwhile.
"""

import json
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import yaml

from kopf.testing.emulator import builtins, errors, patches, schemas, selectors, validation
from kopf.testing.emulator.admission import AdmissionController, AdmissionRequest
from kopf.testing.emulator.resources import (
    CUSTOM_RESOURCE_DEFINITIONS,
    NAMESPACES,
    CrdError,
    ResourceInfo,
    ResourceRegistry,
    StorageKey,
    resources_from_crd,
)
from kopf.testing.emulator.store import (
    ObjectStore,
    StoredObject,
    as_stored_numbers,
    encode,
    parse_number,
    with_api_version,
)

PatchType = Literal['json', 'merge', 'strategic', 'apply']

PATCH_CONTENT_TYPES: dict[str, PatchType] = {
    'application/json-patch+json': 'json',
    'application/merge-patch+json': 'merge',
    'application/strategic-merge-patch+json': 'strategic',
    'application/apply-patch+yaml': 'apply',
}
_CUSTOM_PATCH_CONTENT_TYPES = (
    'application/json-patch+json',
    'application/merge-patch+json',
    'application/apply-patch+yaml',
)
_SYSTEM_METADATA = (
    'uid',
    'creationTimestamp',
    'deletionTimestamp',
    'deletionGracePeriodSeconds',
    'generation',
    'resourceVersion',
)
_UNDELETABLE_NAMESPACES = frozenset({'default', 'kube-system', 'kube-public'})
_GENERATED_NAME_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789'
_GENERATED_NAME_ATTEMPTS = 8
_MAX_ATTEMPTS = 10  # of re-applying an update when the object changed during the admission calls


def now_rfc3339() -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())


class Outcome:
    """The result of a write operation: the HTTP code, the object (already encoded), warnings."""

    __slots__ = ('body', 'code', 'encoded', 'warnings')

    def __init__(
        self, code: int, body: dict[str, Any], encoded: bytes | None = None, warnings: Sequence[str] = ()
    ) -> None:
        self.code = code
        self.body = body
        self.encoded = encoded if encoded is not None else encode(body)
        self.warnings = list(warnings)


def decode_json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_float=parse_number)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {e}") from None


def decode_yaml_body(raw: bytes) -> Any:
    try:
        return as_stored_numbers(yaml.safe_load(raw))
    except yaml.YAMLError as e:
        raise errors.bad_request(f'error converting YAML to JSON: {e}') from None


class Operations:
    """Create, update, patch and delete objects with the API server's conventions."""

    def __init__(
        self, registry: ResourceRegistry, store: ObjectStore, admission: AdmissionController
    ) -> None:
        self.registry = registry
        self.store = store
        self.admission = admission
        self.allocator = builtins.Allocator()  # the Services' cluster IPs and node ports

    # ----------------------------------------------------------------------------------------
    # Reading.

    def get(self, info: ResourceInfo, namespace: str | None, name: str) -> StoredObject:
        stored = self.store.get(info.storage_key, namespace, name)
        if stored is None:
            raise errors.not_found(info.plural, info.group, name)
        return stored

    # ----------------------------------------------------------------------------------------
    # Creating.

    async def create(
        self,
        info: ResourceInfo,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
        field_validation: str = '',
    ) -> Outcome:
        warnings: list[str] = []
        try:
            body = self._check_new_body(info, body)
            if not info.prunes_nothing_in(body):  # else, the general path would return the body as it is
                body = self._structural(info, body, field_validation, warnings)
            if not info.custom:
                body = self._defaulted(info, body, None)
            metadata = dict(body.get('metadata') or {})
            if info.namespaced:
                if metadata.get('namespace') and metadata['namespace'] != namespace:
                    raise errors.bad_request(
                        'the namespace of the provided object does not match the namespace sent on the '
                        'request'
                    )
                metadata['namespace'] = namespace
            else:
                metadata.pop('namespace', None)
            if (
                not metadata.get('name')
                and isinstance(metadata.get('generateName'), str)
                and metadata['generateName']
            ):
                # Like real servers since Kubernetes 1.30 (RetryGenerateName): a generated name that is
                # taken already is generated again, so that the clients do not get 409 for it.
                for _ in range(_GENERATED_NAME_ATTEMPTS):
                    metadata['name'] = metadata['generateName'] + ''.join(
                        random.choices(_GENERATED_NAME_ALPHABET, k=5)
                    )
                    if self.store.get(info.storage_key, namespace, metadata['name']) is None:
                        break
            for field in (*_SYSTEM_METADATA, 'managedFields', 'selfLink'):
                if field != 'generation' or info.has_generation:  # else, like real servers, kept as given
                    metadata.pop(field, None)
            body = {**body, 'apiVersion': info.api_version, 'kind': info.kind, 'metadata': metadata}
            if info.custom and info.has_status:
                # Like real servers: the status of custom objects is not settable on creation.
                body.pop('status', None)

            self._validate_for_create(info, namespace, body)
            if self.admission.active:
                request = AdmissionRequest(
                    info=info,
                    operation='CREATE',
                    namespace=namespace,
                    name=metadata.get('name', ''),
                    obj=body,
                    old_obj=None,
                    dry_run=dry_run,
                    options={
                        'kind': 'CreateOptions',
                        'apiVersion': 'meta.k8s.io/v1',
                        **({'fieldManager': field_manager} if field_manager else {}),
                    },
                )
                body = await self.admission.mutate(request, warnings)
                body = self._restore_identity(info, body, metadata)
                # As real servers do: what the webhooks have changed is pruned and defaulted too.
                body = self._structural(info, body, 'Ignore', [])
                body = self._defaulted(info, body, None)
                self._validate_for_create(info, namespace, body)
                await self.admission.validate(request.replace(obj=body), warnings)
                self._validate_for_create(info, namespace, body)  # re-check: things may change while awaiting

            body = self._prepare_created(info, body)
            if dry_run:
                return Outcome(201, body, warnings=warnings)
            resource_version = self.store.next_resource_version()
            body['metadata']['resourceVersion'] = str(resource_version)
            stored = self.store.put(info.storage_key, body, None)
            self._after_stored(info, body)
            if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
                # Like the watch cache of real servers, which starts with the CRD: no watching from before it.
                state = self.store.state(_crd_storage_key(body))
                state.replayable_after = max(state.replayable_after, resource_version)
            return Outcome(201, body, stored.encoded_as(info.api_version), warnings)
        except errors.ApiError as e:
            e.warnings[:0] = warnings  # like real servers: the warnings found before a failure are sent too
            raise


    @staticmethod
    def _structural(
        info: ResourceInfo, body: dict[str, Any], field_validation: str, warnings: list[str],
        *, patched: bool = False,
    ) -> dict[str, Any]:
        """
        The object pruned of the unknown fields, as real servers prune them (with warnings, or failing).

        A custom object by its CRD's schema (also defaulted, see :mod:`schemas`), a built-in one by its
        kind's top-level fields (see :mod:`builtins`), both of ObjectMeta's fields in ``metadata``.
        """
        original = body
        if info.custom:
            unknown: list[str] = []
            metadata = body.get('metadata')
            if isinstance(metadata, dict):
                pruned = validation.prune_metadata(metadata, unknown)
                body = body if pruned is metadata else {**body, 'metadata': pruned}
            if info.schema is not None:
                body, more = schemas.prune_and_default(body, info.schema)
                unknown.extend(more)
            unknown.sort()  # like real servers: the custom objects' unknown fields sorted
        else:
            body, unknown = builtins.prune(info.plural, info.group, body)
        if unknown and field_validation == 'Strict':
            problem = 'strict decoding error: ' + ', '.join(f'unknown field "{path}"' for path in unknown)
            if patched:  # like real servers: the patched object in full (here, without managedFields)
                text = json.dumps(json.dumps(original, sort_keys=True, separators=(',', ':')))
                raise errors.invalid('', '', '', [errors.Cause('patch', f'Invalid value: {text}: {problem}')])
            raise errors.undecodable(info.kind, info.version, problem)
        if unknown and field_validation != 'Ignore':
            warnings.extend(f'unknown field "{path}"' for path in unknown)
        return body

    def _defaulted(
        self, info: ResourceInfo, body: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """A built-in object with the server's defaults and conversions (see :mod:`builtins`)."""
        if info.custom:
            return body
        return builtins.prepare(info.plural, info.group, body, allocator=self.allocator,
                                creating=old is None, old=old)

    def _check_new_body(self, info: ResourceInfo, raw_body: Any) -> dict[str, Any]:
        if raw_body is None and not info.custom:
            raw_body = {}  # like real servers: JSON's null decodes to an empty object of a built-in kind
        body = _with_default_type(info, raw_body)
        self._check_type(info, body)
        self._check_decodable(info, body)
        return body

    @staticmethod
    def _check_decodable(info: ResourceInfo, body: dict[str, Any]) -> None:
        """Like real servers: a body that does not decode into the Go types is 400, before validation."""
        metadata = body.get('metadata')
        if metadata is None:
            return
        if not isinstance(metadata, dict):
            raise errors.undecodable(
                info.kind, info.version,
                f'json: cannot unmarshal {validation.json_type_name(metadata)} into Go struct field '
                f'{info.kind}.metadata of type v1.ObjectMeta',
            )
        problem = validation.type_problem(metadata, custom=info.custom)
        if problem is not None:
            raise errors.undecodable(info.kind, info.version, problem)
        if not info.custom:
            builtins.check_decodable(info.plural, info.group, info.kind, info.version, body)

    def _check_type(self, info: ResourceInfo, body: dict[str, Any]) -> None:
        if body.get('kind') != info.kind:
            raise errors.bad_request(
                f'the kind of the provided object ({body.get("kind")}) '
                f'does not match the expected kind ({info.kind})'
            )
        group = str(body.get('apiVersion', '')).rpartition('/')[0]
        if group != info.group:
            raise errors.bad_request(
                f'the API version in the data ({body.get("apiVersion")}) does not match '
                f'the expected API version ({info.api_version})'
            )

    def _validate_for_create(self, info: ResourceInfo, namespace: str | None, body: dict[str, Any]) -> None:
        metadata = body['metadata']
        name = metadata.get('name') or ''
        causes = validation.validate_metadata(metadata, info.name_rule)
        if info.schema is not None:
            causes.extend(schemas.validate(body, info.schema))
        elif not info.custom:
            causes.extend(builtins.validate(info.plural, info.group, body))
        if causes:
            raise errors.invalid(info.kind, info.group, name, causes)
        if info.namespaced:
            assert namespace is not None
            namespace_object = self.store.get(NAMESPACES.storage_key, None, namespace)
            if namespace_object is None:
                raise errors.not_found('namespaces', '', namespace)
            if namespace_object.body['metadata'].get('deletionTimestamp'):
                raise errors.namespace_terminating(info.plural, info.group, name, namespace)
        if info.custom:
            crd = self.store.get(CUSTOM_RESOURCE_DEFINITIONS.storage_key, None, f'{info.plural}.{info.group}')
            if crd is not None and crd.body['metadata'].get('deletionTimestamp'):
                raise errors.method_not_allowed(
                    'create not allowed while custom resource definition is terminating'
                )
        if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            self._crd_resources(body)
        if self.store.get(info.storage_key, namespace, name) is not None:
            raise errors.already_exists(info.plural, info.group, name)

    def _crd_resources(self, body: dict[str, Any]) -> list[ResourceInfo]:
        try:
            return resources_from_crd(body)
        except CrdError as e:
            causes = [
                errors.Cause(field, message, reason='FieldValueRequired')
                if message.startswith('Required value') else errors.Cause(field, message)
                for field, message in e.problems
            ] + e.causes
            raise errors.invalid(
                CUSTOM_RESOURCE_DEFINITIONS.kind,
                CUSTOM_RESOURCE_DEFINITIONS.group,
                str(body.get('metadata', {}).get('name', '')),
                causes,
            ) from None

    def _prepare_created(self, info: ResourceInfo, body: dict[str, Any]) -> dict[str, Any]:
        """Fill in what the server owns. The result is a fresh dict the caller may still modify."""
        metadata = dict(body['metadata'])
        metadata['uid'] = str(uuid.uuid4())
        metadata['creationTimestamp'] = now_rfc3339()
        if info.has_generation:  # else, like real servers, neither set nor reset (even if given)
            metadata['generation'] = 1
        for field in ('deletionTimestamp', 'deletionGracePeriodSeconds', 'resourceVersion', 'managedFields'):
            metadata.pop(field, None)
        prepared = {**body, 'metadata': metadata}
        if info.storage_key == NAMESPACES.storage_key:
            metadata['labels'] = {
                **(metadata.get('labels') or {}),
                'kubernetes.io/metadata.name': metadata['name'],
            }
            prepared['spec'] = {'finalizers': ['kubernetes'], **(prepared.get('spec') or {})}
            prepared['status'] = {'phase': 'Active'}
        elif info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            prepared = _established_crd(prepared)
        elif not info.custom:
            prepared = builtins.created(info.plural, info.group, prepared)
        return prepared

    def _restore_identity(self, info: ResourceInfo, body: Any, metadata: dict[str, Any]) -> dict[str, Any]:
        """After mutating webhooks: the identity of the object cannot be changed by them."""
        if not isinstance(body, dict) or not isinstance(body.get('metadata'), dict):
            raise errors.internal_error('a mutating webhook produced an invalid object')
        restored = {
            **body,
            'apiVersion': info.api_version,
            'kind': info.kind,
            'metadata': {**body['metadata'], 'name': metadata.get('name')},
        }
        if info.namespaced:
            restored['metadata']['namespace'] = metadata.get('namespace')
        return restored

    # ----------------------------------------------------------------------------------------
    # Updating and patching.

    async def update(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: str = '',
    ) -> Outcome:
        body = _with_default_type(info, body)
        self._check_type(info, body)
        self._check_decodable(info, body)
        metadata = body.get('metadata')
        for _ in range(_MAX_ATTEMPTS):
            current = self.get(info, namespace, name)
            if info.custom and (not isinstance(metadata, dict) or not metadata.get('resourceVersion')):
                raise errors.invalid(
                    info.kind,
                    info.group,
                    name,
                    [
                        errors.Cause(
                            'metadata.resourceVersion', 'Invalid value: 0x0: must be specified for an update'
                        )
                    ],
                )
            outcome = await self._update_from(info, current, body, subresource=subresource, dry_run=dry_run,
                                              field_validation=field_validation)
            if outcome is not None:
                return outcome
        raise errors.modified_conflict(info.plural, info.group, name)

    async def patch(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        field_validation: str = '',
    ) -> Outcome:
        patch_type = PATCH_CONTENT_TYPES.get(content_type)
        if patch_type is None or (patch_type == 'strategic' and info.custom):
            accepted = _CUSTOM_PATCH_CONTENT_TYPES if info.custom else tuple(PATCH_CONTENT_TYPES)
            raise errors.unsupported_media_type(accepted)
        document = decode_yaml_body(raw) if patch_type == 'apply' else decode_json_body(raw)
        if patch_type == 'apply':
            if not field_manager:
                raise errors.bad_request(
                    'PATCH requests with apply-patch content type must include fieldManager'
                )
            if not isinstance(document, dict):
                raise errors.bad_request('the applied configuration must be an object')
            if self.store.get(info.storage_key, namespace, name) is None:
                applied_name = (document.get('metadata') or {}).get('name')
                if applied_name != name:
                    raise errors.bad_request(
                        f'the name of the object ({applied_name}) does not match the name on the URL ({name})'
                    )
                return await self.create(
                    info, namespace, document, dry_run=dry_run, field_manager=field_manager,
                    field_validation=field_validation,
                )
        elif patch_type in ('merge', 'strategic') and not isinstance(document, dict):
            raise errors.bad_request('the patch must be a JSON object')

        for _ in range(_MAX_ATTEMPTS):
            current = self.get(info, namespace, name)
            base = with_api_version(current.body, info.api_version)
            try:
                if patch_type == 'json':
                    patched = patches.apply_json_patch(base, document)
                elif patch_type == 'strategic':
                    patched = patches.apply_strategic_merge_patch(base, document)
                else:
                    patched = patches.apply_merge_patch(base, document)
            except patches.PatchFormatError as e:
                raise errors.bad_request(str(e)) from None
            except patches.PatchApplicationError as e:
                raise errors.unprocessable(str(e)) from None
            self._check_patched(info, name, patched)
            outcome = await self._update_from(
                info, current, patched, subresource=subresource, dry_run=dry_run,
                field_validation=field_validation, patched=True,
            )
            if outcome is not None:
                return outcome
        raise errors.modified_conflict(info.plural, info.group, name)

    def _check_patched(self, info: ResourceInfo, name: str, patched: Any) -> None:
        """Like real servers: a patch that makes the object undecodable or of another type is 422."""
        if not isinstance(patched, dict):
            raise errors.invalid('', '', '', [errors.Cause(
                'patch', f'Invalid value: "{encode(patched).decode()}": couldn\'t get version/kind; '
                         f'json parse error: json: cannot unmarshal {validation.json_type_name(patched)} '
                         f'into Go value of type struct {{ APIVersion string; Kind string }}',
            )])
        kind, api_version = patched.get('kind'), patched.get('apiVersion')
        group, _, version = str(api_version).rpartition('/')
        if kind != info.kind:
            raise errors.invalid(str(kind), info.group, name, [
                errors.Cause('kind', f'Invalid value: {json.dumps(kind)}: must be {info.kind}')])
        if group != info.group or self.registry.lookup(group, version, info.plural) is None:
            raise errors.invalid(info.kind, info.group, name, [
                errors.Cause('apiVersion', f'Invalid value: {json.dumps(api_version)}: '
                                           f'must be {info.api_version}')])

    async def _update_from(
        self,
        info: ResourceInfo,
        current: StoredObject,
        new_body: dict[str, Any],
        *,
        subresource: str | None,
        dry_run: bool,
        field_validation: str = '',
        patched: bool = False,
    ) -> Outcome | None:
        """Apply a new state to the current object; ``None`` if the object changed while awaiting."""
        warnings: list[str] = []
        try:
            if isinstance(new_body, dict):
                if not info.prunes_nothing_in(new_body):  # else, the general path would return it as it is
                    new_body = self._structural(info, new_body, field_validation, warnings, patched=patched)
                if not info.custom and subresource is None:
                    new_body = self._defaulted(info, new_body, current.body)
            old = current.body
            result = self._prepare_update(info, old, new_body, subresource)
            if result is not None and self.admission.active:
                metadata = old['metadata']
                request = AdmissionRequest(
                    info=info,
                    operation='UPDATE',
                    subresource=subresource,
                    namespace=metadata.get('namespace'),
                    name=metadata['name'],
                    obj=result,
                    old_obj=old,
                    dry_run=dry_run,
                    options={'kind': 'UpdateOptions', 'apiVersion': 'meta.k8s.io/v1'},
                )
                mutated = await self.admission.mutate(request, warnings)
                if mutated is not result and isinstance(mutated, dict):
                    mutated = self._structural(info, mutated, 'Ignore', [])
                if mutated is not result:
                    result = self._prepare_update(info, old, mutated, subresource)
                if result is not None:
                    await self.admission.validate(request.replace(obj=result), warnings)
                stored = self.store.get(info.storage_key, metadata.get('namespace'), metadata['name'])
                if stored is not current:
                    return None
            if result is None:  # nothing changed: like real servers, no new resourceVersion, no event
                return Outcome(200, old, current.encoded_as(info.api_version), warnings)
            return self._commit_update(info, current, result, dry_run=dry_run, warnings=warnings)
        except errors.ApiError as e:
            e.warnings[:0] = warnings  # like real servers: the warnings found before a failure are sent too
            raise


    def _prepare_update(
        self, info: ResourceInfo, old: dict[str, Any], new: Any, subresource: str | None
    ) -> dict[str, Any] | None:
        """The object to store after an update, or ``None`` if nothing changes."""
        if not isinstance(new, dict):
            raise errors.bad_request('the object must be a JSON object')
        old_metadata = old['metadata']
        name = old_metadata['name']
        new_metadata = new.get('metadata')
        if not isinstance(new_metadata, dict):
            raise errors.bad_request(f'the name of the object () does not match the name on the URL ({name})')
        if new_metadata.get('name') != name:
            raise errors.bad_request(
                f'the name of the object ({new_metadata.get("name")}) '
                f'does not match the name on the URL ({name})'
            )
        if info.namespaced and new_metadata.get('namespace') not in (None, '', old_metadata.get('namespace')):
            raise errors.bad_request(
                'the namespace of the provided object does not match the namespace sent on the request'
            )
        self._check_type(info, new)
        new_version = new_metadata.get('resourceVersion')
        if new_version and new_version != old_metadata.get('resourceVersion'):
            raise errors.modified_conflict(info.plural, info.group, name)
        new_uid = new_metadata.get('uid')
        if new_uid and new_uid != old_metadata.get('uid'):
            raise errors.conflict(
                info.plural,
                info.group,
                name,
                f'Precondition failed: UID in precondition: {new_uid}, '
                f'UID in object meta: {old_metadata.get("uid")}',
            )

        if subresource == 'status':
            result = {**old}
            if 'status' in new:
                result['status'] = new['status']
            else:
                result.pop('status', None)
            if result == old:
                return None
            if info.schema is not None:
                causes = schemas.validate(result, info.schema, old=old, subtree='status')
                if causes:
                    raise errors.invalid(info.kind, info.group, name, causes)
            return result

        metadata = dict(new_metadata)
        for field in _SYSTEM_METADATA:
            if field in old_metadata:
                metadata[field] = old_metadata[field]
            else:
                metadata.pop(field, None)
        metadata['name'] = name
        if info.namespaced:
            metadata['namespace'] = old_metadata.get('namespace')
        else:
            metadata.pop('namespace', None)
        metadata.pop('managedFields', None)
        metadata.pop('selfLink', None)
        # The stored version stays as it was: all versions of a resource are the same (no conversion).
        result = {**new, 'apiVersion': old['apiVersion'], 'kind': info.kind, 'metadata': metadata}
        if info.has_status:
            if 'status' in old:
                result['status'] = old['status']
            else:
                result.pop('status', None)

        causes = validation.validate_metadata(
            metadata, info.name_rule, check_name=False, previous=old_metadata
        )
        if info.schema is not None:
            causes.extend(schemas.validate(result, info.schema, old=old))
        elif not info.custom:
            causes.extend(builtins.validate(info.plural, info.group, result))
            causes.extend(builtins.validate_update(info.plural, info.group, result, old))
        if old_metadata.get('deletionTimestamp'):
            added = [
                f for f in metadata.get('finalizers') or [] if f not in (old_metadata.get('finalizers') or [])
            ]
            if added:
                causes.append(
                    errors.Cause(
                        'metadata.finalizers',
                        f'Forbidden: no new finalizers can be added if the object is being deleted, '
                        f'found new finalizers {json.dumps(added)}',
                        reason='FieldValueForbidden',
                    )
                )
        if causes:
            raise errors.invalid(info.kind, info.group, name, causes)
        explanation = None if info.custom else builtins.forbidden_update(info.plural, info.group, result, old)
        if explanation is not None:
            raise errors.forbidden(info.plural, info.group, name, explanation)
        if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            self._crd_resources(result)
            result = _established_crd(result)

        if result == old and patches.json_equal(result, old):
            return None
        skipped = ('metadata', 'status') if info.has_status else ('metadata',)
        keys = (set(old) | set(result)) - set(skipped) - {'apiVersion', 'kind'}
        changed = any(old.get(key) is not result.get(key) and old.get(key) != result.get(key) for key in keys)
        if changed and info.has_generation:
            metadata['generation'] = int(old_metadata.get('generation') or 0) + 1
        return result

    def _commit_update(
        self,
        info: ResourceInfo,
        current: StoredObject,
        result: dict[str, Any],
        *,
        dry_run: bool,
        warnings: list[str],
    ) -> Outcome:
        metadata = result['metadata']
        if (
            metadata.get('deletionTimestamp')
            and not metadata.get('finalizers')
            and not self._has_contents(info, result)
        ):
            # The last finalizer is gone: real servers delete the object instead of storing the update. They
            # answer with the object as updated, of the version it had (the update is not stored); the watches
            # see its deletion only: the object as last stored, of a new version.
            version = current.body['metadata']['resourceVersion']
            answer = {**result, 'metadata': {**metadata, 'resourceVersion': version}}
            if dry_run:
                return Outcome(200, answer, warnings=warnings)
            self._remove(info, current.body)
            return Outcome(200, answer, encode(with_api_version(answer, info.api_version)), warnings)
        if dry_run:
            return Outcome(200, result, warnings=warnings)
        resource_version = self.store.next_resource_version()
        result['metadata'] = {**metadata, 'resourceVersion': str(resource_version)}
        stored = self.store.put(info.storage_key, result, current.body)
        self._after_stored(info, result)
        return Outcome(200, result, stored.encoded_as(info.api_version), warnings)

    def _after_stored(self, info: ResourceInfo, new: dict[str, Any]) -> None:
        if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            self.registry.register_crd(new['metadata']['name'], resources_from_crd(new))

    # ----------------------------------------------------------------------------------------
    # Deleting.

    async def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        options: dict[str, Any],
        *,
        dry_run: bool = False,
    ) -> Outcome:
        current = self.get(info, namespace, name)
        if info.storage_key == NAMESPACES.storage_key and name in _UNDELETABLE_NAMESPACES:
            raise errors.forbidden('namespaces', '', name, 'this namespace may not be deleted')
        preconditions = options.get('preconditions') or {}
        if not isinstance(preconditions, dict):
            raise errors.bad_request('preconditions must be an object')
        self._check_preconditions(info, current.body, preconditions)
        warnings: list[str] = []
        if self.admission.active:
            request = AdmissionRequest(
                info=info,
                operation='DELETE',
                namespace=namespace,
                name=name,
                obj=None,
                old_obj=current.body,
                dry_run=dry_run,
                options={'kind': 'DeleteOptions', 'apiVersion': 'meta.k8s.io/v1', **options},
            )
            await self.admission.validate(request, warnings)
            current = self.get(info, namespace, name)
            self._check_preconditions(info, current.body, preconditions)
        if dry_run:
            return Outcome(200, current.body, current.encoded_as(info.api_version), warnings)
        if options.get('propagationPolicy') == 'Orphan' or options.get('orphanDependents') is True:
            self._orphan_dependents(current.body)
        body, deleted = self._delete_now(info, current)
        # Like real servers: 202 only for a pending deletion with explicitly non-orphaned dependents.
        code = 202 if not deleted and options.get('orphanDependents') is False else 200
        return Outcome(code, with_api_version(body, info.api_version), warnings=warnings)

    async def delete_collection(
        self,
        info: ResourceInfo,
        namespace: str | None,
        label_selector: selectors.LabelSelector,
        field_selector: selectors.FieldSelector,
        options: dict[str, Any],
        *,
        dry_run: bool = False,
    ) -> Outcome:
        items: list[dict[str, Any]] = []
        warnings: list[str] = []
        for stored in list(self.store.objects(info.storage_key, namespace)):
            metadata = stored.body['metadata']
            if not selectors.labels_match(label_selector, metadata.get('labels')):
                continue
            if not selectors.fields_match(field_selector, stored.body):
                continue
            try:
                outcome = await self.delete(
                    info, metadata.get('namespace'), metadata['name'], options, dry_run=dry_run
                )
            except errors.ApiError as e:
                if e.code == 404:  # deleted meanwhile, e.g. as a dependent of another one
                    continue
                raise
            items.append(outcome.body)
            warnings.extend(outcome.warnings)
        body = {
            'kind': info.list_kind,
            'apiVersion': info.api_version,
            'metadata': {'resourceVersion': str(self.store.last_resource_version)},
            'items': items,
        }
        return Outcome(200, body, warnings=warnings)

    def _check_preconditions(
        self, info: ResourceInfo, body: dict[str, Any], preconditions: dict[str, Any]
    ) -> None:
        metadata = body['metadata']
        uid = preconditions.get('uid')
        if uid and uid != metadata.get('uid'):
            raise errors.conflict(
                info.plural,
                info.group,
                metadata['name'],
                f'Precondition failed: UID in precondition: {uid}, UID in object meta: {metadata.get("uid")}',
            )
        version = preconditions.get('resourceVersion')
        if version and version != metadata.get('resourceVersion'):
            raise errors.conflict(
                info.plural,
                info.group,
                metadata['name'],
                f'Precondition failed: ResourceVersion in precondition: {version}, '
                f'ResourceVersion in object meta: {metadata.get("resourceVersion")}',
            )

    def _has_contents(self, info: ResourceInfo, body: dict[str, Any]) -> bool:
        """Whether a namespace still has objects, or a CRD still has custom objects (both block deletion)."""
        if info.storage_key == NAMESPACES.storage_key:
            return self.store.count_in_namespace(body['metadata']['name']) > 0
        if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            return self.store.count(_crd_storage_key(body)) > 0
        return False

    def _delete_now(self, info: ResourceInfo, current: StoredObject) -> tuple[dict[str, Any], bool]:
        """Delete or start deleting an object; return its last state and whether it is gone."""
        body = current.body
        metadata = body['metadata']
        if not metadata.get('finalizers') and not self._has_contents(info, body):
            return self._remove(info, body), True
        if metadata.get('deletionTimestamp'):
            return body, False
        resource_version = self.store.next_resource_version()
        deleting: dict[str, Any] = {
            **body,
            'metadata': {
                **metadata,
                'deletionTimestamp': now_rfc3339(),
                'deletionGracePeriodSeconds': 0,
                'resourceVersion': str(resource_version),
            },
        }
        if info.storage_key == NAMESPACES.storage_key:
            deleting['status'] = {**(body.get('status') or {}), 'phase': 'Terminating'}
        self.store.put(info.storage_key, deleting, body)
        self._delete_contents(info, deleting)
        latest = self.store.get(info.storage_key, metadata.get('namespace'), metadata['name'])
        if latest is None:  # the contents were deleted at once, and the object with them
            return deleting, True
        return latest.body, False

    def _delete_contents(self, info: ResourceInfo, body: dict[str, Any]) -> None:
        if info.storage_key == NAMESPACES.storage_key:
            namespace = body['metadata']['name']
            for key, state in self.store.states():
                if namespace in state.objects:
                    for stored in list(state.objects[namespace].values()):
                        self._delete_dependent(key, stored)
        elif info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            key = _crd_storage_key(body)
            for stored in list(self.store.objects(key)):
                self._delete_dependent(key, stored)

    def _delete_dependent(self, key: StorageKey, stored: StoredObject) -> None:
        versions = self.registry.versions_of(key)
        latest = self.store.get(key, stored.namespace, stored.name)
        if versions and latest is not None and not latest.body['metadata'].get('deletionTimestamp'):
            self._delete_now(versions[0], latest)

    def _remove(self, info: ResourceInfo, body: dict[str, Any]) -> dict[str, Any]:
        resource_version = self.store.next_resource_version()
        final = {**body, 'metadata': {**body['metadata'], 'resourceVersion': str(resource_version)}}
        self.store.remove(info.storage_key, final)
        self._after_removal(info, final)
        return final

    def _after_removal(self, info: ResourceInfo, body: dict[str, Any]) -> None:
        metadata = body['metadata']
        if info.storage_key == CUSTOM_RESOURCE_DEFINITIONS.storage_key:
            self.registry.unregister_crd(metadata['name'])
            for watcher in list(self.store.state(_crd_storage_key(body)).watchers):
                watcher.close()
        namespace = metadata.get('namespace')
        if namespace and self.store.count_in_namespace(namespace) == 0:
            self._finish_if_empty(NAMESPACES, namespace)
        if info.custom and self.store.count(info.storage_key) == 0:
            self._finish_if_empty(CUSTOM_RESOURCE_DEFINITIONS, f'{info.plural}.{info.group}')
        for key, dependent_namespace, name in self.store.dependents_of(str(metadata.get('uid'))):
            dependent = self.store.get(key, dependent_namespace, name)
            if dependent is None:
                continue
            # Like the garbage collector: objects with other owners still alive are kept.
            owners = [
                ref.get('uid')
                for ref in dependent.body['metadata'].get('ownerReferences') or []
                if isinstance(ref, dict)
            ]
            if not any(self.store.uid_exists(str(uid)) for uid in owners):
                self._delete_dependent(key, dependent)

    def _finish_if_empty(self, container: ResourceInfo, name: str) -> None:
        stored = self.store.get(container.storage_key, None, name)
        if stored is None:
            return
        metadata = stored.body['metadata']
        deleting = metadata.get('deletionTimestamp') and not metadata.get('finalizers')
        if deleting and not self._has_contents(container, stored.body):
            self._remove(container, stored.body)

    def _orphan_dependents(self, owner: dict[str, Any]) -> None:
        uid = owner['metadata'].get('uid')
        for key, namespace, name in self.store.dependents_of(str(uid)):
            dependent = self.store.get(key, namespace, name)
            if dependent is None:
                continue
            references = [
                ref
                for ref in dependent.body['metadata'].get('ownerReferences') or []
                if not (isinstance(ref, dict) and ref.get('uid') == uid)
            ]
            metadata = {
                **dependent.body['metadata'],
                'ownerReferences': references,
                'resourceVersion': str(self.store.next_resource_version()),
            }
            if not references:
                del metadata['ownerReferences']
            self.store.put(key, {**dependent.body, 'metadata': metadata}, dependent.body)


def _crd_storage_key(crd: dict[str, Any]) -> StorageKey:
    spec = crd.get('spec') or {}
    return (str(spec.get('group', '')), str((spec.get('names') or {}).get('plural', '')))


def _established_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """Default the names and report the CRD as established at once (real servers do it a moment later)."""
    spec = dict(crd.get('spec') or {})
    names = dict(spec.get('names') or {})
    kind = str(names.get('kind', ''))
    names.setdefault('singular', kind.lower())
    names.setdefault('listKind', f'{kind}List')
    spec['names'] = names
    versions = spec.get('versions') or []
    storage = [v.get('name') for v in versions if isinstance(v, dict) and v.get('storage')]
    old_status = crd.get('status') or {}
    stored_versions = list(old_status.get('storedVersions') or [])
    for version in storage:
        if version not in stored_versions:
            stored_versions.append(version)
    timestamp = str(crd.get('metadata', {}).get('creationTimestamp') or now_rfc3339())
    status = {
        'conditions': [
            {
                'type': 'NamesAccepted',
                'status': 'True',
                'reason': 'NoConflicts',
                'message': 'no conflicts found',
                'lastTransitionTime': timestamp,
            },
            {
                'type': 'Established',
                'status': 'True',
                'reason': 'InitialNamesAccepted',
                'message': 'the initial names have been accepted',
                'lastTransitionTime': timestamp,
            },
        ],
        'acceptedNames': names,
        'storedVersions': stored_versions,
    }
    if crd.get('spec') == spec and crd.get('status') == status:
        return crd
    return {**crd, 'spec': spec, 'status': status}


def _with_default_type(info: ResourceInfo, body: Any) -> dict[str, Any]:
    """Like real servers, take the kind and apiVersion from the URL if the body has none."""
    if not isinstance(body, dict):
        raise errors.bad_request('the body of the request must be a JSON object')
    if body.get('kind') and body.get('apiVersion'):
        return body
    return {
        **body,
        'kind': body.get('kind') or info.kind,
        'apiVersion': body.get('apiVersion') or info.api_version,
    }
