"""
Context variables set while a handler runs, so that helpers can find "the current object".

E.g. ``kopf.adopt(child)`` with no explicit owner takes the body of the object being handled.
"""
import contextvars
from collections.abc import Mapping
from typing import Any

# The body of the object whose handler is being executed now (unset outside of object handlers).
owner_var: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar('owner_var')
