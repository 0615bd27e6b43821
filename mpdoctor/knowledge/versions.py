"""Version numbers and requirement specifiers, without `packaging`.

mpdoctor cannot rely on `packaging` being installed (it is not a dependency), and the
comparisons the rules need are simple: release numbers, a local tag (`+cu124`), and
the operators of a requirement line (`torch>=2.0.0,!=2.1.0`).
"""

from __future__ import annotations

import re
from typing import Iterable

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(\(?[^;]*?\)?)\s*(?:;(.*))?$")
_CLAUSE = re.compile(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*([^\s,]+)\s*$")


def release(version: str | None) -> tuple[int, ...] | None:
    """(2, 6, 0) for "2.6.0+cu124", (12, 4) for "12.4"; None when unreadable."""
    if not version:
        return None
    m = _RELEASE.match(str(version))
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def compare(a: str | tuple[int, ...] | None, b: str | tuple[int, ...] | None) -> int | None:
    """-1, 0 or 1 comparing release numbers; None if either is unreadable."""
    ra = release(a) if not isinstance(a, tuple) else a
    rb = release(b) if not isinstance(b, tuple) else b
    if ra is None or rb is None:
        return None
    n = max(len(ra), len(rb))
    pa, pb = _pad(ra, n), _pad(rb, n)
    return (pa > pb) - (pa < pb)


def at_least(version: str | None, minimum: str) -> bool | None:
    c = compare(version, minimum)
    return None if c is None else c >= 0


def normalise_name(name: str) -> str:
    """PEP 503: `Flash_Attn` and `flash-attn` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(line: str) -> tuple[str, str, str] | None:
    """("torch", ">=2.0.0", 'extra == "torch"') from a Requires-Dist line."""
    m = _REQ.match(line)
    if not m:
        return None
    spec = m.group(2).strip().strip("()").strip()
    return normalise_name(m.group(1)), spec, (m.group(3) or "").strip()


def satisfies(version: str | None, spec: str) -> bool | None:
    """Does `version` meet every clause of `spec` (">=2.0,<3")? None if unknown.

    Pre-release and local tags are ignored: "2.6.0+cu124" counts as 2.6.0, which is
    how pip treats a local version against a public specifier.
    """
    if not spec.strip():
        return True
    if release(version) is None:
        return None
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if not m:
            return None
        op, want = m.groups()
        if want.endswith(".*"):
            prefix = release(want[:-2]) or ()
            got = release(version) or ()
            same = got[: len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        c = compare(version, want)
        if c is None:
            return None
        if op == "~=":
            parts = release(want) or ()
            upper = parts[:-1]
            got = release(version) or ()
            if c < 0 or got[: len(upper)] != upper:
                return False
        elif not {"==": c == 0, "===": c == 0, "!=": c != 0, "<=": c <= 0,
                  ">=": c >= 0, "<": c < 0, ">": c > 0}[op]:
            return False
    return True


def cuda_int_to_str(value: int | None) -> str | None:
    """12040 -> "12.4" (cudaDriverGetVersion / NVML encoding: 1000*major + 10*minor)."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def fmt_capability(cap: Iterable[int] | None) -> str | None:
    if not cap:
        return None
    major, minor = list(cap)[:2]
    return f"{major}.{minor}"
