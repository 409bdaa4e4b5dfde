"""
The framework's OpenTelemetry traces: nothing until enabled, then spans through ``opentelemetry-api``.

``tracing.tracer`` is ``None`` while the traces are off (the places that trace pay one global lookup
and import nothing); :func:`enable` sets it to the API's tracer of this framework, which records
whatever the application's SDK is configured to record (with no SDK, the API's spans are no-ops).
The operator enables it at start if ``settings.tracing.enabled`` says so (by default: if
``opentelemetry-api`` is installed and the application has configured an SDK's tracer provider, since
the spans of the API's default provider record nothing and would only cost CPU for every event):
``pip install "kopf[tracing]"``.

The spans: a handling cycle per processed event (``kopf.process``: the object's identity, the event's
type, the cause), a child per handler call (``kopf.handler``: its id and outcome), a child per API
request (``HTTP PATCH`` etc.: the method, the resource, the status). The handlers run in the cycle's
context (also the sync ones, in threads), so their own spans and instrumented calls join the trace.
"""
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ['INSTALL_HINT', 'annotate', 'disable', 'enable', 'is_configured', 'is_installed', 'tracer']

INSTALL_HINT = 'pip install "kopf[tracing]" (or opentelemetry-api)'
SCOPE = 'kopf'

tracer: 'Tracer | None' = None


def is_installed() -> bool:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def is_configured() -> bool:
    """Whether the application has set a real tracer provider (an SDK's), not the API's default proxy."""
    if 'opentelemetry.trace' not in sys.modules:
        return False  # nobody has set a provider without importing it (not imported only for the check)
    from opentelemetry import trace
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def enable(provider: Any = None) -> 'Tracer':
    """Turn the traces on with the global tracer provider (or the given one); raise what to install."""
    global tracer
    try:
        from opentelemetry import trace
    except ImportError:
        raise ImportError(f'The traces need opentelemetry-api: {INSTALL_HINT}.') from None
    tracer = trace.get_tracer(SCOPE, tracer_provider=provider)
    return tracer


def disable() -> None:
    global tracer
    tracer = None


def annotate(key: str, value: Any) -> None:
    """Set an attribute of the current span (e.g. the cause of a cycle, once known); no-op if off."""
    if tracer is not None:
        from opentelemetry import trace
        trace.get_current_span().set_attribute(key, value)
