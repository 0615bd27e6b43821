"""Byte sizes: read from messages, written for people."""

from __future__ import annotations

import re

_UNITS = {
    "b": 1, "bytes": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5, "eib": 1024**6,
    "eb": 1000**6, "pb": 1000**5,
}
_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGTPE]?i?B|bytes)", re.IGNORECASE)
GIB = 1024**3
_BINARY = (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024))


def parse_size(text: str | None) -> int | None:
    """The first size in `text`: '2.00 GiB' -> 2147483648, '512 bytes' -> 512,
    '3 GB' -> 3000000000; None when there is none."""
    if not text:
        return None
    m = _SIZE.search(str(text))
    if not m:
        return None
    factor = _UNITS.get(m.group("unit").lower())
    if factor is None:
        return None
    return int(float(m.group("num")) * factor)


def gib(n: int | float | None) -> str | None:
    """Bytes for people, as torch's memory messages write them: two decimals in the
    largest binary unit that fits, up to GiB as torch goes ('1.53 GiB', '612.38 MiB',
    '4.00 KiB', '18626.45 GiB'), whole bytes below 1 KiB ('80 B'); None for None."""
    if n is None:
        return None
    for unit, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
