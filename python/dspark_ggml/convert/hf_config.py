"""Typed, validated reads of a Hugging Face config.json.

Every lookup names the file and field in its error, so a refusal tells the user exactly which
value is wrong. JSON booleans are not accepted where integers are expected and vice versa.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import ConversionError

_REQUIRED = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_list_of(v: Any, ok: Callable[[Any], bool]) -> bool:
    return isinstance(v, list) and all(ok(x) for x in v)


class Config:
    def __init__(self, data: dict, where: str):
        if not isinstance(data, dict):
            raise ConversionError(f"{where}: expected a JSON object")
        self.data = data
        self.where = where

    @classmethod
    def load(cls, model_dir: Path) -> "Config":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConversionError(f"{model_dir}: no config.json (is this a Hugging Face model "
                                  "directory?)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ConversionError(f"{path}: invalid JSON ({e})") from None
        return cls(data, str(path))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _fail(self, key: str, expected: str) -> ConversionError:
        return ConversionError(f"{self.where}: field {key!r} should be {expected}, "
                               f"got {self.data.get(key)!r}")

    def _lookup(self, key: str, default: Any) -> tuple[bool, Any]:
        """(found, value); a missing or null field gives the default or, without one, an error."""
        value = self.data.get(key)
        if value is not None:
            return True, value
        if default is _REQUIRED:
            raise ConversionError(f"{self.where}: required field {key!r} is missing")
        return False, default

    def _checked(self, key: str, default: Any, ok: Callable[[Any], bool], expected: str,
                 convert: Callable[[Any], Any] = lambda v: v) -> Any:
        """The field converted, when ``ok`` accepts it; the default when it is absent."""
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not ok(value):
            raise self._fail(key, expected)
        return convert(value)

    def int(self, key: str, default: Any = _REQUIRED, *, minimum: Optional[int] = None) -> Any:
        value = self._checked(key, default, _is_int, "an integer")
        if minimum is not None and self.has(key) and value < minimum:
            raise self._fail(key, f"an integer >= {minimum}")
        return value

    def float(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, _is_number, "a number", float)

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: isinstance(v, str), "a string")

    def int_list(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: _is_list_of(v, _is_int), "a list of integers", list)

    def float_list(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: _is_list_of(v, _is_number), "a list of numbers",
                             lambda v: [float(x) for x in v])

    def str_list(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: _is_list_of(v, lambda x: isinstance(x, str)),
                             "a list of strings", list)

    def sub(self, key: str) -> Optional["Config"]:
        """A nested object as its own Config, or None when absent."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._fail(key, "an object")
        return Config(value, f"{self.where}: {key}")

    def architecture(self) -> str:
        archs = self.str_list("architectures")
        if len(archs) != 1:
            raise self._fail("architectures", "a list with exactly one entry")
        return archs[0]


def agreed(name: str, places: list[Config], read: Callable[[Config, str], Any]) -> Any:
    """A field that may be stated in several configs (read from each by `read`): the value they
    agree on, or None when none states it; configs that disagree are an error."""
    found = [(c, read(c, name)) for c in places]
    found = [(c, v) for c, v in found if v is not None]
    if len({repr(v) for _, v in found}) > 1:
        stated = "; ".join(f"{v!r} in {c.where}" for c, v in found)
        raise ConversionError(f"field {name!r} is stated differently in different places ({stated})")
    return found[0][1] if found else None
