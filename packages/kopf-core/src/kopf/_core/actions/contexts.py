"""
Context variables set while a handler runs, so that helpers can find "the current object".

E.g. ``kopf.adopt(child)`` with no explicit owner takes the body of the object being handled.
"""
import contextvars
from collections.abc import Mapping
from typing import Any

from kopf._core.intents.causes import BaseCause
from kopf._core.intents.handlers import BaseHandler
from kopf._core.intents.registries import ChangingRegistry

# The body of the object whose handler is being executed now (unset outside of object handlers).
owner_var: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar('owner_var')

# The handler being executed now, its cause, and the registry for its sub-handlers: set by the execution
# of the changing handlers, so that ``kopf.subhandler()``/``kopf.register()`` inside of a handler know
# where to put the sub-handlers and how to name them, and ``kopf.execute()`` knows what to execute.
handler_var: contextvars.ContextVar[BaseHandler] = contextvars.ContextVar('handler_var')
cause_var: contextvars.ContextVar[BaseCause] = contextvars.ContextVar('cause_var')
subregistry_var: contextvars.ContextVar[ChangingRegistry] = contextvars.ContextVar('subregistry_var')
