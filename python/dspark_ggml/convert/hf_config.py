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

    def int(self, key: str, default: Any = _REQUIRED, *, minimum: Optional[int] = None) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer")
        if minimum is not None and value < minimum:
            raise self._fail(key, f"an integer >= {minimum}")
        return value

    def float(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number")
        return float(value)

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def str(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def int_list(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self._fail(key, "a list of integers")
        return list(value)

    def float_list(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not isinstance(value, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise self._fail(key, "a list of numbers")
        return [float(v) for v in value]

    def str_list(self, key: str, default: Any = _REQUIRED) -> Any:
        found, value = self._lookup(key, default)
        if not found:
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "a list of strings")
        return list(value)

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
