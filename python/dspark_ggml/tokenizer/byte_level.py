"""The byte <-> printable-character mapping of byte-level BPE vocabularies (GPT-2 style).

Byte-level vocabularies store each byte as one printable character so that tokens are
valid text: bytes that are already printable and not whitespace keep their own code point,
the others (control characters, space, a few Latin-1 ones) are moved to U+0100 upward in
byte order.
"""
from __future__ import annotations

from functools import lru_cache


def _keeps_own_code_point(b: int) -> bool:
    return (0x21 <= b <= 0x7E) or (0xA1 <= b <= 0xAC) or (0xAE <= b <= 0xFF)


@lru_cache(maxsize=1)
def byte_to_char() -> tuple[str, ...]:
    """Character for each byte value 0..255."""
    chars: list[str] = []
    shifted = 0
    for b in range(256):
        if _keeps_own_code_point(b):
            chars.append(chr(b))
        else:
            chars.append(chr(256 + shifted))
            shifted += 1
    return tuple(chars)


@lru_cache(maxsize=1)
def char_to_byte_table() -> dict[int, int]:
    """`str.translate` table turning each mapped character into the code point of its byte.

    After translation a token's text holds only code points < 256, so `.encode("latin-1")`
    yields its bytes in one C-level pass.
    """
    table: dict[int, int] = {ord(ch): b for b, ch in enumerate(byte_to_char())}
    # Code points below 256 that the mapping moved away must not pass through as their own
    # byte: send them above 255 so the latin-1 encode fails and the slow path handles them.
    for cp in range(256):
        table.setdefault(cp, 0xFFFF)
    return table


@lru_cache(maxsize=1)
def _char_to_byte() -> dict[str, int]:
    return {ch: b for b, ch in enumerate(byte_to_char())}


def token_text_to_bytes(text: str) -> bytes:
    """Bytes of a byte-level token; characters outside the mapping are kept as UTF-8."""
    translated = text.translate(char_to_byte_table())
    try:
        return translated.encode("latin-1")
    except UnicodeEncodeError:
        # Only tokens that were not produced by the byte-level encoding get here.
        mapping = _char_to_byte()
        return b"".join(bytes((mapping[c],)) if c in mapping else c.encode("utf-8", "surrogateescape")
                        for c in text)
