"""The JSON of the API traffic: the same results with orjson and with the standard library alone."""
import dataclasses
import datetime
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from kopf._cogs.helpers import jsons
from kopf._cogs.structs.patches import Patch


def _load_without_orjson(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # A separate instance of the module, as it is where orjson is not installed (the real one is untouched).
    monkeypatch.setitem(sys.modules, 'orjson', None)  # type: ignore[arg-type]
    spec = importlib.util.spec_from_file_location('jsons_without_orjson', jsons.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._orjson is None
    return module


@pytest.fixture(params=['orjson', 'stdlib'])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if request.param == 'orjson':
        pytest.importorskip('orjson')
        yield jsons
    else:
        yield _load_without_orjson(monkeypatch)


@dataclasses.dataclass
class _Thing:
    x: int


BIG = 2 ** 70


def test_objects_are_parsed(codec: Any) -> None:
    document = b'{"type":"ADDED","object":{"metadata":{"name":"n"},"spec":{"x":[1,2.5,null,true]}}}'
    assert codec.loads(document) == \
        {'type': 'ADDED', 'object': {'metadata': {'name': 'n'}, 'spec': {'x': [1, 2.5, None, True]}}}
    assert codec.loads(bytearray(b'{"a": "\xc3\xa9"}')) == {'a': 'é'}


@pytest.mark.parametrize('value', [BIG, 2 ** 64, -2 ** 63 - 1, -BIG, 2 ** 64 - 1, -2 ** 63])
def test_integers_beyond_64_bits_are_parsed(codec: Any, value: int) -> None:
    # orjson 3.13 reads some of them as floats (2 ** 64, -2 ** 63 - 1), losing digits, with no error.
    assert codec.loads(f'{{"big": {value}}}'.encode()) == {'big': value}
    assert codec.loads(f'[{value}]') == [value]
    assert codec.loads(bytearray(f'{value}'.encode())) == value
    assert type(codec.loads(f'{value}')) is int


def test_integers_beyond_64_bits_are_parsed_from_texts_with_other_characters(codec: Any) -> None:
    # A text is searched for the long runs of digits as its UTF-8: the other characters are not digits.
    assert codec.loads(f'{{"é": {BIG}, "ж": "٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣٣"}}') == {'é': BIG, 'ж': '٣' * 20}
    assert codec.loads(f'{{"é": {2 ** 64}}}') == {'é': 2 ** 64}


def test_long_digit_runs_that_are_not_integers_are_parsed(codec: Any) -> None:
    assert codec.loads(b'{"s": "12345678901234567890123", "f": 1.2345678901234567890123}') == \
        {'s': '12345678901234567890123', 'f': 1.2345678901234567890123}


@pytest.mark.parametrize('data', [b'{"a": ', b'\xff\xfe', b'nope', b''])
def test_malformed_documents_are_value_errors(codec: Any, data: bytes) -> None:
    with pytest.raises(ValueError):
        codec.loads(data)


def test_patches_are_encoded_compactly_in_utf8(codec: Any) -> None:
    patch = Patch({'status': {'tick': 5, 'text': 'é', 'big': BIG}})
    assert codec.dumps(patch) == f'{{"status":{{"tick":5,"text":"é","big":{BIG}}}}}'.encode()


def test_non_string_keys_are_converted_as_json_does(codec: Any) -> None:
    assert codec.dumps({'spec': {1: 'one'}}) == b'{"spec":{"1":"one"}}'


@pytest.mark.parametrize('value', [datetime.datetime(2026, 1, 1), _Thing(1), object()],
                         ids=['datetime', 'dataclass', 'object'])
def test_unencodable_values_fail_as_with_json(codec: Any, value: object) -> None:
    with pytest.raises(TypeError):
        codec.dumps({'spec': {'value': value}})
