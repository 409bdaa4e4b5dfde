"""
The types of the user-provided functions: handlers of every kind and filter callbacks.

All of them are called with keyword arguments only (plus the positional value for value filters),
so they are typed loosely: what matters is what they return.
"""
from collections.abc import Callable, Coroutine
from typing import Any

# What a handler may return: any JSON-serialisable result (or nothing), directly or via a coroutine.
SyncOrAsyncResult = object | None | Coroutine[None, None, object | None]

# Operator-level handlers: startup, cleanup, login, probe.
ActivityFn = Callable[..., SyncOrAsyncResult]

# Resource handlers by their kind.
WatchingFn = Callable[..., Coroutine[None, None, None] | None]
ChangingFn = Callable[..., SyncOrAsyncResult]
DaemonFn = Callable[..., SyncOrAsyncResult]
TimerFn = Callable[..., SyncOrAsyncResult]
IndexingFn = Callable[..., SyncOrAsyncResult]
WebhookFn = Callable[..., Coroutine[None, None, None] | None]

# Any resource or activity handler, as stored in the registries.
HandlerFn = Callable[..., Any]

# Filters: whole-object callbacks (``when=``) and per-value callbacks (``labels={'x': fn}`` etc.).
WhenFilterFn = Callable[..., bool]
MetaFilterFn = Callable[..., bool]

# The ``initial_delay=`` of daemons and timers can be computed per object by a callback.
DelayFn = Callable[..., float | None]
