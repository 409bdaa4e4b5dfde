"""
Server-side printing: ``meta.k8s.io`` Tables, as ``kubectl get`` asks for them in its Accept header.

Built-in resources get the generic columns (name and age); custom resources get the columns
of their CRD's ``additionalPrinterColumns`` (simple JSONPaths only: ``.a.b``, ``.a[0].b``).
"""

import datetime
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kopf.testing.emulator.resources import ResourceInfo

_NAME_COLUMN = {
    'name': 'Name',
    'type': 'string',
    'format': 'name',
    'priority': 0,
    'description': 'Name must be unique within a namespace.',
}
_AGE_COLUMN = {
    'name': 'Age',
    'type': 'date',
    'format': '',
    'priority': 0,
    'description': 'CreationTimestamp is a timestamp representing the server time '
    'when this object was created.',
}
_PATH_TOKEN = re.compile(r'\.([^.\[\]]+)|\[(\d+)\]')


def table_version(accept: str) -> str | None:
    """The Table version that the client accepts (``v1`` or ``v1beta1``), or ``None`` if it wants objects."""
    for media_type in accept.split(','):
        parameters = dict(part.strip().partition('=')[::2] for part in media_type.split(';')[1:])
        if parameters.get('as') == 'Table' and parameters.get('g') == 'meta.k8s.io':
            return parameters.get('v', 'v1')
    return None


def _columns(info: ResourceInfo) -> list[dict[str, Any]]:
    if not info.printer_columns:
        return [_NAME_COLUMN, _AGE_COLUMN]
    columns = [_NAME_COLUMN]
    for column in info.printer_columns:
        columns.append(
            {
                'name': column.get('name', ''),
                'type': column.get('type', 'string'),
                'format': column.get('format', ''),
                'description': column.get('description', ''),
                'priority': column.get('priority', 0),
            }
        )
    return columns


def _evaluate(obj: Any, path: str) -> Any:
    """Evaluate a simple JSONPath; anything unresolvable (or more complex) gives ``None``."""
    current = obj
    position = 0
    path = path.strip()
    if path.startswith('{') and path.endswith('}'):
        path = path[1:-1]
    while position < len(path):
        match = _PATH_TOKEN.match(path, position)
        if match is None:
            return None
        key, index = match.groups()
        if key is not None:
            current = current.get(key) if isinstance(current, Mapping) else None
        else:
            current = current[int(index)] if isinstance(current, list) and int(index) < len(current) else None
        if current is None:
            return None
        position = match.end()
    return current


def human_age(timestamp: Any, now: datetime.datetime | None = None) -> str:
    """How long ago an RFC 3339 timestamp was, in the short style of kubectl (``42s``, ``5m3s``, ``2d``)."""
    try:
        moment = datetime.datetime.strptime(str(timestamp), '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.UTC)
    except ValueError:
        return '<unknown>'
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - moment).total_seconds())
    if seconds < -1:
        return '<invalid>'
    if seconds < 120:
        return f'{max(seconds, 0)}s'
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 10:
        return f'{minutes}m{seconds % 60}s' if seconds % 60 else f'{minutes}m'
    if minutes < 180:
        return f'{minutes}m'
    if hours < 8:
        return f'{hours}h{minutes % 60}m' if minutes % 60 else f'{hours}h'
    if hours < 48:
        return f'{hours}h'
    if hours < 24 * 8:
        return f'{days}d{hours % 24}h' if hours % 24 else f'{days}d'
    if days < 365 * 2:
        return f'{days}d'
    if days < 365 * 8:
        return f'{days // 365}y{days % 365}d' if days % 365 else f'{days // 365}y'
    return f'{days // 365}y'


def _cell(value: Any, column_type: str) -> Any:
    if value is None:
        return None
    if column_type == 'date':
        return human_age(value)
    if column_type in ('integer', 'number', 'boolean') and isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(',', ':'))
    return value if isinstance(value, str) else json.dumps(value)


def _row(info: ResourceInfo, body: Mapping[str, Any], include_object: str) -> dict[str, Any]:
    metadata = body.get('metadata', {})
    cells: list[Any] = [metadata.get('name')]
    if not info.printer_columns:
        cells.append(human_age(metadata.get('creationTimestamp')))
    for column in info.printer_columns:
        cells.append(
            _cell(_evaluate(body, str(column.get('jsonPath', ''))), str(column.get('type', 'string')))
        )
    row: dict[str, Any] = {'cells': cells}
    if include_object == 'Object':
        row['object'] = body
    elif include_object != 'None':
        row['object'] = {
            'kind': 'PartialObjectMetadata',
            'apiVersion': 'meta.k8s.io/v1',
            'metadata': metadata,
        }
    return row


def make_table(
    info: ResourceInfo,
    bodies: Iterable[Mapping[str, Any]],
    *,
    version: str,
    include_object: str,
    list_metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        'kind': 'Table',
        'apiVersion': f'meta.k8s.io/{version}',
        'metadata': dict(list_metadata or {}),
        'columnDefinitions': _columns(info),
        'rows': [_row(info, body, include_object) for body in bodies],
    }
