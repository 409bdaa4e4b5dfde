"""
Type aliases shared by all layers of the framework.
"""
import logging
from typing import Any

# Whatever can log: the framework passes either plain loggers or per-object adapters to functions.
Logger = logging.Logger | logging.LoggerAdapter[Any]
