"""Reading numbers as they appear in messages."""

from __future__ import annotations

import re

_UNITS = {
    "b": 1, "bytes": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5, "eib": 1024**6,
    "eb": 1000**6, "pb": 1000**5,
}
_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGTPE]?i?B|bytes)", re.IGNORECASE)
GIB = 1024**3


def parse_size(text: str | None) -> int | None:
    """'2.00 GiB' -> 2147483648; None when it is not a size."""
    if not text:
        return None
    m = _SIZE.search(str(text))
    if not m:
        return None
    factor = _UNITS.get(m.group("unit").lower())
    if factor is None:
        return None
    return int(float(m.group("num")) * factor)


def gib(n: int | float) -> str:
    """Bytes as the GiB figure messages use: '1.53 GiB'; small ones in MiB."""
    if abs(n) < GIB:
        return f"{n / 1024**2:.2f} MiB"
    return f"{n / GIB:.2f} GiB"
