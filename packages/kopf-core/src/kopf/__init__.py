"""
Kopf: the Kubernetes Operator Pythonic Framework.

This package is assembled from several distributions: kopf-clients (the API client),
kopf-core (this module, ``kopf.on``, the reactor), kopf-webhooks, kopf-cli and kopf-testing.
Names that live in the upper distributions are resolved lazily on first access, so that
``pip install kopf-core`` alone is enough to embed an operator.
"""
# Portions of the `kopf` package installed from other distributions (e.g. editable installs,
# which put each distribution's `src/` on sys.path separately) must be found too.
__path__ = __import__('pkgutil').extend_path(__path__, __name__)

import importlib
import importlib.util
from typing import Any

from kopf._clients.logins import (
    login_via_async_client,
    login_via_client,
    login_via_pykube,
    login_with_kubeconfig,
    login_with_service_account,
)
from kopf._clients.vault import (
    Vault,
)
from kopf._cogs.configs.networking import (
    NetworkingSettings,
    WatchingSettings,
)
from kopf._cogs.helpers.typedefs import (
    Logger,
)
from kopf._cogs.structs.bodies import (
    Annotations,
    Body,
    BodyEssence,
    Labels,
    Meta,
    RawBody,
    RawEvent,
    RawEventType,
    Spec,
    Status,
)
from kopf._cogs.structs.credentials import (
    AiohttpSession,
    ConnectionInfo,
    LoginError,
)
from kopf._cogs.structs.dicts import (
    FieldPath,
    FieldSpec,
)
from kopf._cogs.structs.diffs import (
    Diff,
    DiffItem,
    DiffOperation,
)
from kopf._cogs.structs.patches import (
    Patch,
    PatchFn,
)
from kopf._cogs.structs.references import (
    EVERYTHING,
    Resource,
)
from kopf._cogs.structs.reviews import (
    Headers,
    Operation,
    SSLPeer,
    UserInfo,
    WebhookClientConfig,
    WebhookClientConfigService,
    WebhookFn,
    WebhookServerProtocol,
)
from kopf._core.actions.errors import (
    AdmissionError,
    HandlerRetriesError,
    HandlerTimeoutError,
    PermanentError,
    TemporaryError,
)
from kopf._core.actions.execution import (
    execute,
)
from kopf._core.actions.lifecycles import (
    get_default_lifecycle,
    set_default_lifecycle,
)
from kopf._core.actions.loggers import (
    LocalObjectLogger,
    LogFormat,
    ObjectLogger,
    configure,
)
from kopf._core.engines.daemons import (
    AsyncDaemonStopperChecker,
    DaemonStopped,
    DaemonStoppingReason,
    SyncDaemonStopperChecker,
)
from kopf._core.engines.indexing import (
    Index,
    OperatorIndexers,
    Store,
)
from kopf._core.engines.posting import (
    event,
    exception,
    info,
    warn,
)
from kopf._core.intents.configuration import (
    OperatorSettings,
)
from kopf._core.intents.filters import (
    ABSENT,
    PRESENT,
    MetaFilterToken,
    all_,
    any_,
    none_,
    not_,
)
from kopf._core.intents.handlers import (
    ErrorsMode,
    HandlerId,
    Reason,
)
from kopf._core.intents.memos import (
    Memo,
)
from kopf._core.intents.registries import (
    OperatorRegistry,
    get_default_registry,
    set_default_registry,
)
from kopf._core.persistence.diffbase import (
    AnnotationsDiffBaseStorage,
    DiffBaseStorage,
    MultiDiffBaseStorage,
    StatusDiffBaseStorage,
)
from kopf._core.persistence.progress import (
    AnnotationsProgressStorage,
    MultiProgressStorage,
    ProgressRecord,
    ProgressStorage,
    SmartProgressStorage,
    StatusProgressStorage,
)
from kopf._core.reactor.inventory import (
    ResourceMemories,
)
from kopf._core.reactor.running import (
    operator,
    run,
    run_tasks,
    spawn_tasks,
)
from kopf._kits.hierarchies import (
    ObjectReference,
    OwnerReference,
    adjust_namespace,
    adopt,
    append_owner_reference,
    build_object_reference,
    build_owner_reference,
    harmonize_naming,
    label,
    remove_owner_reference,
)
from kopf.on import (
    daemon,
    index,
    register,
    subhandler,
    timer,
)

from kopf import on  # isort: skip  (the module itself is public: `kopf.on.create(...)`)
from kopf._core.actions import lifecycles  # isort: skip  (public as `kopf.lifecycles`)

# The upper distributions' names are declared for type checkers here once their modules exist
# (``if TYPE_CHECKING: from kopf._webhooks.servers import WebhookServer as WebhookServer``);
# until then, the module-level ``__getattr__`` gives them the type ``Any``.

# Public names provided by the upper distributions: name -> (module, distribution).
_LAZY_NAMES: dict[str, tuple[str, str]] = {
    'WebhookServer': ('kopf._webhooks.servers', 'kopf-webhooks'),
    'WebhookK3dServer': ('kopf._webhooks.servers', 'kopf-webhooks'),
    'WebhookMinikubeServer': ('kopf._webhooks.servers', 'kopf-webhooks'),
    'WebhookDockerDesktopServer': ('kopf._webhooks.servers', 'kopf-webhooks'),
    'WebhookAutoServer': ('kopf._webhooks.servers', 'kopf-webhooks'),
    'WebhookNgrokTunnel': ('kopf._webhooks.tunnels', 'kopf-webhooks'),
    'WebhookAutoTunnel': ('kopf._webhooks.tunnels', 'kopf-webhooks'),
}


def __getattr__(name: str) -> Any:
    if name == 'testing':  # the subpackage of kopf-testing, as in `kopf.testing.KopfRunner` (if installed)
        return _import_upper('kopf.testing', 'kopf-testing', name)
    try:
        module_name, distribution = _LAZY_NAMES[name]
    except KeyError:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}') from None
    value = getattr(_import_upper(module_name, distribution, name), name)
    globals()[name] = value  # cache: next accesses do not come here
    return value


def _import_upper(module_name: str, distribution: str, name: str) -> Any:
    """Import a module of an upper distribution; if the distribution is missing, say what to install."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only a missing distribution is explained; a missing module inside an installed
        # distribution is a real bug there and must surface as it is.
        if e.name is None or not module_name.startswith(e.name) or _is_installed(distribution):
            raise
        raise ImportError(
            f'kopf.{name} is provided by the {distribution!r} distribution, which is not installed. '
            f'Install it with: pip install {distribution}  (or: pip install kopf, for everything)',
            name=module_name,
        ) from e


def _is_installed(distribution: str) -> bool:
    import importlib.metadata
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))


__all__ = [
    'ABSENT',
    'EVERYTHING',
    'PRESENT',
    'AdmissionError',
    'AiohttpSession',
    'Annotations',
    'AnnotationsDiffBaseStorage',
    'AnnotationsProgressStorage',
    'AsyncDaemonStopperChecker',
    'Body',
    'BodyEssence',
    'ConnectionInfo',
    'DaemonStopped',
    'DaemonStoppingReason',
    'Diff',
    'DiffBaseStorage',
    'DiffItem',
    'DiffOperation',
    'ErrorsMode',
    'FieldPath',
    'FieldSpec',
    'HandlerId',
    'HandlerRetriesError',
    'HandlerTimeoutError',
    'Headers',
    'Index',
    'Labels',
    'LocalObjectLogger',
    'LogFormat',
    'Logger',
    'LoginError',
    'Memo',
    'Meta',
    'MetaFilterToken',
    'MultiDiffBaseStorage',
    'MultiProgressStorage',
    'NetworkingSettings',
    'ObjectLogger',
    'ObjectReference',
    'Operation',
    'OperatorIndexers',
    'OperatorRegistry',
    'OperatorSettings',
    'OwnerReference',
    'Patch',
    'PatchFn',
    'PermanentError',
    'ProgressRecord',
    'ProgressStorage',
    'RawBody',
    'RawEvent',
    'RawEventType',
    'Reason',
    'Resource',
    'ResourceMemories',
    'SSLPeer',
    'SmartProgressStorage',
    'Spec',
    'Status',
    'StatusDiffBaseStorage',
    'StatusProgressStorage',
    'Store',
    'SyncDaemonStopperChecker',
    'TemporaryError',
    'UserInfo',
    'Vault',
    'WatchingSettings',
    'WebhookClientConfig',
    'WebhookClientConfigService',
    'WebhookFn',
    'WebhookServerProtocol',
    'adjust_namespace',
    'adopt',
    'all_',
    'any_',
    'append_owner_reference',
    'build_object_reference',
    'build_owner_reference',
    'configure',
    'daemon',
    'event',
    'exception',
    'execute',
    'get_default_lifecycle',
    'get_default_registry',
    'harmonize_naming',
    'index',
    'info',
    'label',
    'lifecycles',
    'login_via_async_client',
    'login_via_client',
    'login_via_pykube',
    'login_with_kubeconfig',
    'login_with_service_account',
    'none_',
    'not_',
    'on',
    'operator',
    'register',
    'remove_owner_reference',
    'run',
    'run_tasks',
    'set_default_lifecycle',
    'set_default_registry',
    'spawn_tasks',
    'subhandler',
    'timer',
    'warn',
]

# The servers and tunnels of kopf-webhooks are in `from kopf import *` too, if that distribution is installed
# (a star-import of kopf-core alone must not fail on them).
if importlib.util.find_spec('kopf._webhooks') is not None:
    __all__ += sorted(_LAZY_NAMES)
