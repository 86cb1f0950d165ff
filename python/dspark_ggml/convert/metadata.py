"""An ordered collection of typed GGUF key/value pairs, filled before anything is written."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from gguf import GGUFValueType


@dataclass(frozen=True)
class KeyValue:
    value: Any
    type: GGUFValueType
    item_type: Optional[GGUFValueType] = None  # for arrays


class KeyValues:
    """Typed setters; `{arch}` in a key is filled in. Setting a key twice is a bug unless
    `replace=True` says the second value deliberately wins."""

    def __init__(self, arch: str):
        self.arch = arch
        self._items: dict[str, KeyValue] = {}

    def _set(self, key: str, kv: KeyValue, replace: bool) -> None:
        key = key.format(arch=self.arch)
        if key in self._items and not replace:
            raise AssertionError(f"metadata key {key} set twice")
        self._items[key] = kv

    def u32(self, key: str, value: int, *, replace: bool = False) -> None:
        if not 0 <= int(value) < 2**32:
            raise ValueError(f"{key}: {value} does not fit in uint32")
        self._set(key, KeyValue(int(value), GGUFValueType.UINT32), replace)

    def f32(self, key: str, value: float, *, replace: bool = False) -> None:
        self._set(key, KeyValue(float(value), GGUFValueType.FLOAT32), replace)

    def boolean(self, key: str, value: bool, *, replace: bool = False) -> None:
        self._set(key, KeyValue(bool(value), GGUFValueType.BOOL), replace)

    def string(self, key: str, value: str, *, replace: bool = False) -> None:
        self._set(key, KeyValue(str(value), GGUFValueType.STRING), replace)

    def array(self, key: str, values: Sequence[Any], item_type: GGUFValueType, *,
              replace: bool = False) -> None:
        if len(values) == 0:
            raise ValueError(f"{key}: GGUF arrays cannot be empty")
        self._set(key, KeyValue(list(values), GGUFValueType.ARRAY, item_type), replace)

    def update(self, other: "KeyValues") -> None:
        for key, kv in other.items():
            self._set(key, kv, replace=False)

    def __contains__(self, key: str) -> bool:
        return key.format(arch=self.arch) in self._items

    def get(self, key: str) -> Any:
        kv = self._items.get(key.format(arch=self.arch))
        return None if kv is None else kv.value

    def items(self) -> Iterator[tuple[str, KeyValue]]:
        return iter(self._items.items())
