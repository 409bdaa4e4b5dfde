"""
The decorators that register handlers: ``@kopf.on.create(...)``, ``@kopf.on.startup()``, etc.

Every decorator validates its options when it is called, i.e. at import time of the operator's
code, so that mistakes fail loudly before the operator starts rather than silently at runtime.
The handlers go into the default registry unless ``registry=`` is given.

Only plain functions (incl. lambdas, partials, closures), static methods, and bound methods
of specific instances can be handlers: a function defined in a class body with ``self``/``cls``
is rejected, since it is unclear which instance (or subclass) it would be called for.
"""
import inspect
import numbers
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

from kopf._cogs.structs import dicts
from kopf._cogs.structs.references import Marker, Resource, Selector
from kopf._core.actions.contexts import handler_var, subregistry_var
from kopf._core.intents import callbacks, filters, handlers, registries
from kopf._core.intents.handlers import Activity, ErrorsMode, HandlerId, Reason, WebhookType

__all__ = [
    'cleanup',
    'create',
    'daemon',
    'delete',
    'event',
    'field',
    'index',
    'login',
    'mutate',
    'probe',
    'register',
    'resume',
    'startup',
    'subhandler',
    'timer',
    'update',
    'validate',
]

_HandlerT = TypeVar('_HandlerT', bound=handlers.BaseHandler)
_FnT = TypeVar('_FnT', bound=Callable[..., Any])

ResourceArg = str | Marker | Callable[[Resource], bool] | None
NameArg = str | Marker | None
AdmissionOperation = Literal['CREATE', 'UPDATE', 'DELETE', 'CONNECT']


#
# Operator activities.
#

def startup(
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ActivityFn], callbacks.ActivityFn]:
    """``@kopf.on.startup()``: run before the operator starts serving anything."""
    return _activity('@kopf.on.startup()', Activity.STARTUP, id=id, param=param, errors=errors,
                     timeout=timeout, retries=retries, backoff=backoff, registry=registry)


def cleanup(
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ActivityFn], callbacks.ActivityFn]:
    """``@kopf.on.cleanup()``: run when the operator exits (gracefully)."""
    return _activity('@kopf.on.cleanup()', Activity.CLEANUP, id=id, param=param, errors=errors,
                     timeout=timeout, retries=retries, backoff=backoff, registry=registry)


def login(
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ActivityFn], callbacks.ActivityFn]:
    """``@kopf.on.login()``: get the credentials for the API (instead of the default login functions)."""
    return _activity('@kopf.on.login()', Activity.AUTHENTICATION, id=id, param=param, errors=errors,
                     timeout=timeout, retries=retries, backoff=backoff, registry=registry)


def probe(
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ActivityFn], callbacks.ActivityFn]:
    """``@kopf.on.probe()``: add a value (under the handler's id) to the liveness endpoint's response."""
    return _activity('@kopf.on.probe()', Activity.PROBE, id=id, param=param, errors=errors,
                     timeout=timeout, retries=retries, backoff=backoff, registry=registry)


def _activity(
        decorator: str,
        activity: Activity,
        *,
        id: str | None,
        param: Any,
        errors: ErrorsMode | None,
        timeout: float | None,
        retries: int | None,
        backoff: float | None,
        registry: registries.OperatorRegistry | None,
) -> Callable[[callbacks.ActivityFn], callbacks.ActivityFn]:
    real_registry = _get_registry(decorator, registry)
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)

    def make(fn: callbacks.HandlerFn) -> handlers.ActivityHandler:
        return handlers.ActivityHandler(
            fn=fn, id=registries.generate_id(fn, id=id), param=param, activity=activity,
            errors=errors if errors is not None else ErrorsMode.TEMPORARY,
            timeout=timeout, retries=retries, backoff=backoff,
        )

    return _decorator(decorator, make, real_registry.activities.append)


#
# Resource changes.
#

def resume(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        deleted: bool | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """
    ``@kopf.on.resume()``: for the objects existing when the operator starts (once per operator lifetime).

    Not invoked for the objects being deleted, unless ``deleted=True``.
    """
    decorator = '@kopf.on.resume()'
    _check_flag(decorator, 'deleted', deleted)
    return _changing(
        decorator, (arg1, arg2, arg3), _names(group, version, kind, plural, singular, shortcut, category),
        reason=Reason.RESUME, initial=True, deleted=deleted,
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when, field=field, value=value, registry=registry,
    )


def create(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """``@kopf.on.create()``: for the objects that have never been handled yet."""
    return _changing(
        '@kopf.on.create()', (arg1, arg2, arg3),
        _names(group, version, kind, plural, singular, shortcut, category),
        reason=Reason.CREATE,
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when, field=field, value=value, registry=registry,
    )


def update(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        old: filters.ValueFilter | None = None,
        new: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """
    ``@kopf.on.update()``: for the essential changes of the objects (or of one field, with ``field=``).

    ``value=`` matches either the old or the new value of the field; ``old=``/``new=`` match them separately.
    """
    return _changing(
        '@kopf.on.update()', (arg1, arg2, arg3),
        _names(group, version, kind, plural, singular, shortcut, category),
        reason=Reason.UPDATE, field_needs_change=True,
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when, field=field, value=value, old=old, new=new,
        registry=registry,
    )


def delete(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        optional: bool | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """
    ``@kopf.on.delete()``: for the objects marked for deletion.

    The objects are blocked from the actual deletion (with a finalizer) until these handlers succeed,
    unless ``optional=True``: then they are called only if the object is still there for other reasons.
    """
    decorator = '@kopf.on.delete()'
    _check_flag(decorator, 'optional', optional)
    return _changing(
        decorator, (arg1, arg2, arg3), _names(group, version, kind, plural, singular, shortcut, category),
        reason=Reason.DELETE, requires_finalizer=not optional,
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when, field=field, value=value, registry=registry,
    )


def field(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec,
        value: filters.ValueFilter | None = None,
        old: filters.ValueFilter | None = None,
        new: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """``@kopf.on.field()``: for the changes of one field, whatever the cause (creation, update, ...)."""
    decorator = '@kopf.on.field()'
    if field is None or not dicts.parse_field(field):
        raise TypeError(f'{decorator} requires a non-empty field=, e.g. field="spec.replicas".')
    return _changing(
        decorator, (arg1, arg2, arg3), _names(group, version, kind, plural, singular, shortcut, category),
        reason=None, field_needs_change=True,
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when, field=field, value=value, old=old, new=new,
        registry=registry,
    )


def _changing(
        decorator: str,
        positionals: tuple[ResourceArg, NameArg, NameArg],
        names: dict[str, str | None],
        *,
        reason: Reason | None,
        initial: bool | None = None,
        deleted: bool | None = None,
        requires_finalizer: bool | None = None,
        field_needs_change: bool | None = None,
        id: str | None,
        param: Any,
        errors: ErrorsMode | None,
        timeout: float | None,
        retries: int | None,
        backoff: float | None,
        labels: filters.MetaFilter | None,
        annotations: filters.MetaFilter | None,
        when: callbacks.WhenFilterFn | None,
        field: dicts.FieldSpec,
        value: filters.ValueFilter | None,
        old: filters.ValueFilter | None = None,
        new: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, positionals, names)
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value, old=old, new=new)

    def make(fn: callbacks.HandlerFn) -> handlers.ChangingHandler:
        return handlers.ChangingHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field), param=param,
            errors=errors if errors is not None else ErrorsMode.TEMPORARY,
            timeout=timeout, retries=retries, backoff=backoff,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value, old=old, new=new,
            reason=reason, initial=initial, deleted=deleted,
            requires_finalizer=requires_finalizer, field_needs_change=field_needs_change,
        )

    return _decorator(decorator, make, real_registry.changing.append)


#
# Raw events, daemons, timers, indices.
#

def event(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.WatchingFn], callbacks.WatchingFn]:
    """``@kopf.on.event()``: for every raw watch-event; no state is stored, the errors are only logged."""
    decorator = '@kopf.on.event()'
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, (arg1, arg2, arg3),
                              _names(group, version, kind, plural, singular, shortcut, category))
    _check_id(decorator, id)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value)

    def make(fn: callbacks.HandlerFn) -> handlers.WatchingHandler:
        return handlers.WatchingHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field), param=param, errors=ErrorsMode.IGNORED,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value,
        )

    return _decorator(decorator, make, real_registry.watching.append)


def daemon(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        initial_delay: float | callbacks.DelayFn | None = None,
        cancellation_backoff: float | None = None,
        cancellation_timeout: float | None = None,
        cancellation_polling: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.DaemonFn], callbacks.DaemonFn]:
    """``@kopf.daemon()``: a long-running function per object, while it exists and matches the filters."""
    decorator = '@kopf.daemon()'
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, (arg1, arg2, arg3),
                              _names(group, version, kind, plural, singular, shortcut, category))
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)
    _check_delay(decorator, 'initial_delay', initial_delay, allow_callable=True)
    _check_delay(decorator, 'cancellation_backoff', cancellation_backoff)
    _check_delay(decorator, 'cancellation_timeout', cancellation_timeout)
    _check_delay(decorator, 'cancellation_polling', cancellation_polling, positive=True)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value)

    def make(fn: callbacks.HandlerFn) -> handlers.DaemonHandler:
        return handlers.DaemonHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field), param=param,
            errors=errors if errors is not None else ErrorsMode.TEMPORARY,
            timeout=timeout, retries=retries, backoff=backoff,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value,
            initial_delay=initial_delay, cancellation_backoff=cancellation_backoff,
            cancellation_timeout=cancellation_timeout, cancellation_polling=cancellation_polling,
        )

    return _decorator(decorator, make, real_registry.spawning.append)


def timer(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        interval: float | None = None,
        initial_delay: float | callbacks.DelayFn | None = None,
        sharp: bool | None = None,
        idle: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.TimerFn], callbacks.TimerFn]:
    """``@kopf.timer()``: a function called regularly per object, while it exists and matches the filters."""
    decorator = '@kopf.timer()'
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, (arg1, arg2, arg3),
                              _names(group, version, kind, plural, singular, shortcut, category))
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)
    _check_delay(decorator, 'interval', interval, positive=True)
    _check_delay(decorator, 'initial_delay', initial_delay, allow_callable=True)
    _check_delay(decorator, 'idle', idle)
    _check_flag(decorator, 'sharp', sharp)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value)
    if sharp and interval is None:
        raise TypeError(f'{decorator}: sharp=True needs interval= (the calls are sharp to the interval).')
    if interval is None and idle is None:
        warnings.warn(f'{decorator} has neither interval= nor idle=: it will be called once per object. '
                      f'Add interval= (seconds between the calls) or idle= (seconds the object stays '
                      f'unchanged) to repeat it.', UserWarning, stacklevel=2)

    def make(fn: callbacks.HandlerFn) -> handlers.TimerHandler:
        return handlers.TimerHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field), param=param,
            errors=errors if errors is not None else ErrorsMode.TEMPORARY,
            timeout=timeout, retries=retries, backoff=backoff,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value,
            interval=interval, initial_delay=initial_delay, sharp=sharp, idle=idle,
        )

    return _decorator(decorator, make, real_registry.spawning.append)


def index(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.IndexingFn], callbacks.IndexingFn]:
    """
    ``@kopf.index()``: an in-memory index of the objects, available to all handlers as a kwarg.

    The handler's id (the function's name by default) is the index's name and kwarg: unlike other
    handlers, it gets no field suffix. The errors are ignored by default (the stale values stay).
    """
    decorator = '@kopf.index()'
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, (arg1, arg2, arg3),
                              _names(group, version, kind, plural, singular, shortcut, category))
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value)

    def make(fn: callbacks.HandlerFn) -> handlers.IndexingHandler:
        return handlers.IndexingHandler(
            fn=fn, id=registries.generate_id(fn, id=id), param=param,
            errors=errors if errors is not None else ErrorsMode.IGNORED,
            timeout=timeout, retries=retries, backoff=backoff,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value,
        )

    return _decorator(decorator, make, real_registry.indexing.append)


#
# Admission webhooks.
#

def validate(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        operation: AdmissionOperation | None = None,
        operations: Collection[AdmissionOperation] | None = None,
        subresource: str | None = None,
        persistent: bool | None = None,
        side_effects: bool | None = None,
        ignore_failures: bool | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.WebhookFn], callbacks.WebhookFn]:
    """``@kopf.on.validate()``: a validating admission webhook (raise ``kopf.AdmissionError`` to reject)."""
    return _webhook(
        '@kopf.on.validate()', WebhookType.VALIDATING, (arg1, arg2, arg3),
        _names(group, version, kind, plural, singular, shortcut, category),
        id=id, param=param, operation=operation, operations=operations, subresource=subresource,
        persistent=persistent, side_effects=side_effects, ignore_failures=ignore_failures,
        labels=labels, annotations=annotations, when=when, field=field, value=value, registry=registry,
    )


def mutate(
        arg1: ResourceArg = None,
        arg2: NameArg = None,
        arg3: NameArg = None,
        /,
        *,
        group: str | None = None,
        version: str | None = None,
        kind: str | None = None,
        plural: str | None = None,
        singular: str | None = None,
        shortcut: str | None = None,
        category: str | None = None,
        id: str | None = None,
        param: Any | None = None,
        operation: AdmissionOperation | None = None,
        operations: Collection[AdmissionOperation] | None = None,
        subresource: str | None = None,
        persistent: bool | None = None,
        side_effects: bool | None = None,
        ignore_failures: bool | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        registry: registries.OperatorRegistry | None = None,
) -> Callable[[callbacks.WebhookFn], callbacks.WebhookFn]:
    """``@kopf.on.mutate()``: a mutating admission webhook (modify the ``patch`` kwarg to mutate)."""
    return _webhook(
        '@kopf.on.mutate()', WebhookType.MUTATING, (arg1, arg2, arg3),
        _names(group, version, kind, plural, singular, shortcut, category),
        id=id, param=param, operation=operation, operations=operations, subresource=subresource,
        persistent=persistent, side_effects=side_effects, ignore_failures=ignore_failures,
        labels=labels, annotations=annotations, when=when, field=field, value=value, registry=registry,
    )


def _webhook(
        decorator: str,
        webhook_type: WebhookType,
        positionals: tuple[ResourceArg, NameArg, NameArg],
        names: dict[str, str | None],
        *,
        id: str | None,
        param: Any,
        operation: str | None,
        operations: Collection[str] | None,
        subresource: str | None,
        persistent: bool | None,
        side_effects: bool | None,
        ignore_failures: bool | None,
        labels: filters.MetaFilter | None,
        annotations: filters.MetaFilter | None,
        when: callbacks.WhenFilterFn | None,
        field: dicts.FieldSpec,
        value: filters.ValueFilter | None,
        registry: registries.OperatorRegistry | None,
) -> Callable[[callbacks.WebhookFn], callbacks.WebhookFn]:
    real_registry = _get_registry(decorator, registry)
    selector = _make_selector(decorator, positionals, names)
    _check_id(decorator, id)
    real_operations = _check_operations(decorator, operation, operations)
    if subresource is not None and (not isinstance(subresource, str) or not subresource):
        raise TypeError(f'{decorator}: subresource= must be a non-empty string (or "*" for all), '
                        f'got {subresource!r}.')
    for name, flag in [('persistent', persistent), ('side_effects', side_effects),
                       ('ignore_failures', ignore_failures)]:
        _check_flag(decorator, name, flag)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value)

    def make(fn: callbacks.HandlerFn) -> handlers.WebhookHandler:
        return handlers.WebhookHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field), param=param, reason=webhook_type,
            selector=selector, labels=labels, annotations=annotations, when=when,
            field=real_field, value=value,
            operations=real_operations, subresource=subresource,
            persistent=persistent, side_effects=side_effects, ignore_failures=ignore_failures,
        )

    return _decorator(decorator, make, real_registry.webhooks.append)


def _check_operations(
        decorator: str,
        operation: str | None,
        operations: Collection[str] | None,
) -> frozenset[str] | None:
    if operation is not None and operations is not None:
        raise TypeError(f'{decorator}: operation= and operations= are mutually exclusive; '
                        f'use operations= only.')
    if operation is not None:
        operations = [operation]
    if operations is None:
        return None
    if isinstance(operations, str) or not isinstance(operations, Collection):
        raise TypeError(f'{decorator}: operations= must be a collection of strings, got {operations!r}.')
    unknown = [op for op in operations if op not in handlers.ADMISSION_OPERATIONS]
    if unknown:
        known = ', '.join(sorted(handlers.ADMISSION_OPERATIONS))
        raise ValueError(f'{decorator}: unknown admission operation(s) {unknown!r}; '
                         f'expected some of: {known}.')
    if not operations:
        raise ValueError(f'{decorator}: operations= cannot be empty; use None for all operations.')
    return frozenset(operations)


#
# Sub-handlers.
#

def subhandler(
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
        field: dicts.FieldSpec = None,
        value: filters.ValueFilter | None = None,
        old: filters.ValueFilter | None = None,
        new: filters.ValueFilter | None = None,
) -> Callable[[callbacks.ChangingFn], callbacks.ChangingFn]:
    """
    ``@kopf.subhandler()``: declare a sub-handler of the handler being executed now.

    Usable only inside of a changing handler. The sub-handler's id is prefixed with the parent's id
    (e.g. ``create_fn/item1``). The parent handler is not finished until all its sub-handlers are;
    it is called again on every handling cycle to declare them again.
    """
    decorator = '@kopf.subhandler()'
    parent, subregistry = _get_current_handler(decorator)
    _check_execution_options(decorator, id=id, errors=errors, timeout=timeout,
                             retries=retries, backoff=backoff)
    real_field = _check_filters(decorator, labels=labels, annotations=annotations, when=when,
                                field=field, value=value, old=old, new=new)

    def make(fn: callbacks.HandlerFn) -> handlers.ChangingHandler:
        return handlers.ChangingHandler(
            fn=fn, id=_make_id(fn, id=id, field=real_field, prefix=parent.id), param=param,
            errors=errors if errors is not None else ErrorsMode.TEMPORARY,
            timeout=timeout, retries=retries, backoff=backoff,
            labels=labels, annotations=annotations, when=when,
            field=real_field, value=value, old=old, new=new,
        )

    return _decorator(decorator, make, subregistry.append)


def register(
        fn: callbacks.ChangingFn,
        *,
        id: str | None = None,
        param: Any | None = None,
        errors: ErrorsMode | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        labels: filters.MetaFilter | None = None,
        annotations: filters.MetaFilter | None = None,
        when: callbacks.WhenFilterFn | None = None,
) -> callbacks.ChangingFn:
    """
    Register a function as a sub-handler of the handler being executed now (as ``@kopf.subhandler()``).

    Returns the function as it is.
    """
    return subhandler(
        id=id, param=param, errors=errors, timeout=timeout, retries=retries, backoff=backoff,
        labels=labels, annotations=annotations, when=when,
    )(fn)


def _get_current_handler(decorator: str) -> tuple[handlers.BaseHandler, registries.ChangingRegistry]:
    try:
        return handler_var.get(), subregistry_var.get()
    except LookupError:
        raise LookupError(
            f'{decorator} can be used only inside of a handler being executed '
            f'(there is no current handler to attach the sub-handlers to).'
        ) from None


#
# Shared checks and helpers.
#

def _decorator(
        decorator: str,
        make: Callable[[callbacks.HandlerFn], _HandlerT],
        append: Callable[[_HandlerT], None],
) -> Callable[[_FnT], _FnT]:
    """The actual decorator: check the function, make the handler, register it, return the function as is."""

    def decorate(fn: _FnT) -> _FnT:
        append(make(_check_fn(decorator, fn)))
        return fn

    return decorate


def _get_registry(
        decorator: str,
        registry: registries.OperatorRegistry | None,
) -> registries.OperatorRegistry:
    if registry is None:
        return registries.get_default_registry()
    if not isinstance(registry, registries.OperatorRegistry):
        raise TypeError(f'{decorator}: registry= must be a kopf.OperatorRegistry, got {registry!r}.')
    return registry


def _names(
        group: str | None,
        version: str | None,
        kind: str | None,
        plural: str | None,
        singular: str | None,
        shortcut: str | None,
        category: str | None,
) -> dict[str, str | None]:
    return {
        'group': group, 'version': version, 'kind': kind, 'plural': plural,
        'singular': singular, 'shortcut': shortcut, 'category': category,
    }


def _make_selector(
        decorator: str,
        positionals: tuple[ResourceArg, NameArg, NameArg],
        names: dict[str, str | None],
) -> Selector:
    try:
        return Selector(*positionals, **names)
    except (TypeError, ValueError) as e:
        raise type(e)(f'{decorator}: invalid resource specification: {e}') from e


def _make_id(
        fn: callbacks.HandlerFn,
        *,
        id: str | None,
        field: dicts.FieldPath | None,
        prefix: str | None = None,
) -> HandlerId:
    suffix = '.'.join(field) if field else None
    return registries.generate_id(fn, id=id, prefix=prefix, suffix=suffix)


def _check_fn(decorator: str, fn: Any) -> callbacks.HandlerFn:
    """Check that the decorated object can be a handler; return the function to be called."""
    if isinstance(fn, classmethod):
        raise TypeError(
            f'{decorator} cannot decorate class methods: it is unclear for which (sub)class to call them. '
            f'Use plain functions or static methods, or decorate a specific bound method explicitly.'
        )
    if isinstance(fn, staticmethod):  # e.g. @kopf.on.create(...) above @staticmethod in a class body
        fn = fn.__func__
    if not callable(fn):
        raise TypeError(f'{decorator} decorates functions, got {fn!r}.')
    if _looks_like_unbound_method(fn):
        raise TypeError(
            f'{decorator} cannot decorate {fn.__qualname__}(): instance and class methods are not supported '
            f'as handlers, since it is unclear for which instance or subclass to call them. '
            f'Use plain functions or static methods, or decorate a bound method of a specific instance '
            f'explicitly: {decorator.strip("@()")}(...)(instance.method).'
        )
    return fn  # type: ignore[no-any-return]


def _looks_like_unbound_method(fn: Any) -> bool:
    # A function defined in a class body (not in a function's body) with "self" or "cls" first:
    # a method-to-be. Static methods have no such parameter and are fine.
    if not inspect.isfunction(fn):
        return False
    scopes = fn.__qualname__.split('.')
    if len(scopes) < 2 or scopes[-2] == '<locals>':
        return False
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(parameters) and parameters[0].kind in positional and parameters[0].name in ('self', 'cls')


def _check_id(decorator: str, id: str | None) -> None:
    if id is not None and not isinstance(id, str):
        raise TypeError(f'{decorator}: id= must be a string, got {id!r}.')
    if id is not None and not id:
        raise ValueError(f'{decorator}: id= cannot be empty; omit it to use the function name.')


def _check_flag(decorator: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f'{decorator}: {name}= must be True, False, or None, got {value!r}.')


def _check_number(
        decorator: str,
        name: str,
        value: Any,
        *,
        integer: bool = False,
        positive: bool = False,
) -> None:
    if value is None:
        return
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = 'an integer' if integer else 'a number'
        raise TypeError(f'{decorator}: {name}= must be {expected} or None, got {value!r}.')
    if value < 0 or (positive and value == 0):
        expected = 'positive' if positive else 'non-negative'
        raise ValueError(f'{decorator}: {name}= must be {expected}, got {value!r}.')


def _check_delay(
        decorator: str,
        name: str,
        value: Any,
        *,
        positive: bool = False,
        allow_callable: bool = False,
) -> None:
    if allow_callable and callable(value):
        return
    _check_number(decorator, name, value, positive=positive)


def _check_execution_options(
        decorator: str,
        *,
        id: str | None,
        errors: ErrorsMode | None,
        timeout: float | None,
        retries: int | None,
        backoff: float | None,
) -> None:
    _check_id(decorator, id)
    if errors is not None and not isinstance(errors, ErrorsMode):
        raise TypeError(f'{decorator}: errors= must be one of kopf.ErrorsMode, got {errors!r}.')
    _check_number(decorator, 'timeout', timeout)
    _check_number(decorator, 'retries', retries, integer=True)
    _check_number(decorator, 'backoff', backoff)


def _check_filters(
        decorator: str,
        *,
        labels: filters.MetaFilter | None,
        annotations: filters.MetaFilter | None,
        when: callbacks.WhenFilterFn | None,
        field: dicts.FieldSpec,
        value: filters.ValueFilter | None,
        old: filters.ValueFilter | None = None,
        new: filters.ValueFilter | None = None,
) -> dicts.FieldPath | None:
    """Check the filters' consistency; return the parsed field (None if not given)."""
    _check_metadata_filter(decorator, 'labels', labels)
    _check_metadata_filter(decorator, 'annotations', annotations)
    if when is not None and not callable(when):
        raise TypeError(f'{decorator}: when= must be a callable of the handler\'s kwargs, got {when!r}.')

    try:
        real_field = dicts.parse_field(field)
    except TypeError as e:
        raise TypeError(f'{decorator}: invalid field=: {e}') from e
    if field is not None and not real_field:
        raise ValueError(f'{decorator}: field= cannot be empty; omit it to handle the whole object.')
    if any(not key for key in real_field):
        raise ValueError(f'{decorator}: field= has empty parts: {field!r}.')

    if value is not None and not real_field:
        raise TypeError(f'{decorator}: value= needs field= to know which field to check.')
    if value is not None and (old is not None or new is not None):
        raise TypeError(
            f'{decorator}: value= cannot be combined with old=/new= (it would be ambiguous); '
            f'use either value= (for the old or the new value), or old=/new= (for each of them).'
        )
    return real_field or None


def _check_metadata_filter(decorator: str, name: str, criteria: Any) -> None:
    if criteria is None:
        return
    if not isinstance(criteria, Mapping):
        raise TypeError(f'{decorator}: {name}= must be a mapping of keys to criteria, got {criteria!r}.')
    for key, criterion in criteria.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f'{decorator}: {name}= keys must be non-empty strings, got {key!r}.')
        if criterion is None:
            raise TypeError(
                f'{decorator}: {name}={{{key!r}: None}} is ambiguous; '
                f'use kopf.ABSENT for the absence or kopf.PRESENT for the presence of the key.'
            )
        if not isinstance(criterion, (str, filters.MetaFilterToken)) and not callable(criterion):
            raise TypeError(
                f'{decorator}: {name}={{{key!r}: {criterion!r}}} must be a string, '
                f'kopf.PRESENT/kopf.ABSENT, or a callback.'
            )
