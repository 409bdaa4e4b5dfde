"""
The former place of :mod:`kopf._cogs.aiokits.alarms`, for the imports not moved yet (the reactor's queueing).
"""
from kopf._cogs.aiokits.alarms import CLOCK_SLACK, Alarms

__all__ = ['CLOCK_SLACK', 'Alarms']
