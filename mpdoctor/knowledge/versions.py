"""Version numbers, requirement specifiers and CUDA/cuDNN version numbers: the one place
mpdoctor reads and compares them.

Comparisons are pip's (PEP 440, through `packaging`): a dev build or pre-release
(`2.6.0.dev20241001+cu124`, `2.1.0a0+git1234`, `2.0.0rc1`) is older than its release,
and a local tag (`+cu124`) is ignored against a public version, so `2.6.0+cu124`
satisfies `>=2.6`. A string `packaging` cannot read (`2.1.0 (custom)`) is compared by
its leading release numbers; one without any (`unknown`) gives None.

`packaging` is imported on first use, inside the functions that compare: `mpdoctor
explain` imports this module with the derivers and must start like a small script.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_RELEASE = re.compile(r"^\s*v?(?:\d+!)?(\d+(?:\.\d+)*)")
_REQUIRES_DIST = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(\(?[^;]*?\)?)\s*(?:;(.*))?$")
_MESSAGE_REQ = re.compile(r"^\s*(?P<pkg>[A-Za-z0-9_.\-\[\]]+?)?\s*(?P<op>>=|<=|==|!=|~=|>|<)\s*(?P<ver>[\w.+\-]+)")


def release(version: Any) -> tuple[int, ...] | None:
    """(2, 6, 0) for "2.6.0+cu124", (12, 4) for "12.4", (2, 1, 0) for "2.1.0 (custom)";
    None when there are no leading release numbers."""
    if version is None:
        return None
    m = _RELEASE.match(str(version))
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def major(version: Any) -> int | None:
    """12 for "12.4" or "12"; None when unreadable."""
    r = release(version)
    return r[0] if r else None


@lru_cache(maxsize=2048)
def _parse(version: str) -> Any:
    """packaging's Version; for a string it cannot read, the Version of its leading
    release numbers; None when there are none."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version)
    except InvalidVersion:
        r = release(version)
        return Version(".".join(map(str, r))) if r else None


def _version(version: Any) -> Any:
    return None if version is None else _parse(str(version).strip())


def compare(a: Any, b: Any) -> int | None:
    """-1, 0 or 1 as pip orders a and b (`570.26` == `570.26.0`); None if either is unreadable."""
    va, vb = _version(a), _version(b)
    if va is None or vb is None:
        return None
    if va.local is None or vb.local is None:  # a local tag does not order against a public version
        va, vb = _parse(va.public), _parse(vb.public)
    return (va > vb) - (va < vb)


def at_least(version: Any, minimum: Any) -> bool | None:
    c = compare(version, minimum)
    return None if c is None else c >= 0


def is_prerelease(version: Any) -> bool:
    """True for "2.1.0a0+git1234", "2.0.0rc1", "2.6.0.dev20241001"."""
    v = _version(version)
    return bool(v is not None and v.is_prerelease)


@lru_cache(maxsize=512)
def _specifier_set(spec: str) -> Any:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec)
    except InvalidSpecifier:
        return None


def satisfies(version: Any, spec: str) -> bool | None:
    """Does `version` meet every clause of `spec` (">=2.0,<3", "~=2.4", "==2.13.*"), as
    pip checks an installed version (pre-releases included)? None if either is unreadable."""
    if not spec.strip():
        return True
    v = _version(version)
    specs = _specifier_set(spec.strip())
    if v is None or specs is None:
        return None
    return specs.contains(v, prereleases=True)


def normalise_name(name: str) -> str:
    """PEP 503: `Flash_Attn` and `flash-attn` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requires_dist(line: str) -> tuple[str, str, str] | None:
    """A package's metadata line: 'torch (>=2.0.0) ; extra == "torch"' ->
    ("torch", ">=2.0.0", 'extra == "torch"'), the name PEP 503-normalised."""
    m = _REQUIRES_DIST.match(line)
    if not m:
        return None
    spec = m.group(2).strip().strip("()").strip()
    return normalise_name(m.group(1)), spec, (m.group(3) or "").strip()


def parse_message_requirement(text: str | None) -> tuple[str | None, str, str] | None:
    """A requirement as an error message words it: 'accelerate>=0.20.1' ->
    ('accelerate', '>=', '0.20.1'); '>= 2.1' -> (None, '>=', '2.1'). Only the first
    clause of 'tokenizers>=0.14,<0.19' is returned."""
    if not text:
        return None
    m = _MESSAGE_REQ.match(str(text).strip().strip("`'\""))
    if not m:
        return None
    return (m.group("pkg") or None), m.group("op"), m.group("ver")


def cuda_int_to_str(value: Any) -> str | None:
    """A CUDA version written as one integer (int or digits) -> "major.minor".

    Three encodings are met in practice, and one reading serves them all:
    - 1000*major + 10*minor: the driver API (cudaDriverGetVersion), NVML and the
      CUDA_VERSION macro: 11040 -> 11.4, 12020 -> 12.2, 9000 -> 9.0, 6050 -> 6.5;
    - MMmm, as torch and xformers print a build's CUDA: 1201 -> 12.1, 1108 -> 11.8;
    - the 2-3 digits of a wheel tag (cu121): 121 -> 12.1, 118 -> 11.8, 92 -> 9.2.
    CUDA majors in MMmm form are >= 10, so an MMmm number has 4 digits and starts with
    1, while a 4-digit number of the 1000*major form has a major below 10: from 2000
    to 9999 it is CUDA 2.x-9.x (CUDA 1.x, whose numbers would also start with 1, is
    never reported by these APIs). So: 2-3 digits are a tag, 1000-1999 is MMmm,
    2000-99999 is 1000*major + 10*minor. None for anything else.
    """
    text = str(value).strip() if value is not None else ""
    if not text.isdigit():
        return None
    n = int(text)
    if 10 <= n < 1000:
        return f"{n // 10}.{n % 10}"
    if 1000 <= n < 2000:
        return f"{n // 100}.{n % 100}"
    if 2000 <= n < 100000:
        return f"{n // 1000}.{(n % 1000) // 10}"
    return None


def cudnn_version(value: Any) -> str | None:
    """cuDNN versions as torch reports them: '(8, 9, 2)' -> '8.9.2'; 8902 or '7102' ->
    '8.9.2' / '7.1.2' (MAJOR*1000 + MINOR*100 + PATCH); 90100 -> '9.1.0' (cuDNN 9 packs
    MAJOR*10000 + MINOR*100 + PATCH)."""
    if value is None:
        return None
    s = str(value).strip()
    parts = re.findall(r"\d+", s)
    if s.startswith("(") and len(parts) >= 2:
        return ".".join(parts[:3])
    if s.isdigit():
        n = int(s)
        if n >= 10000:
            return f"{n // 10000}.{(n % 10000) // 100}.{n % 100}"
        if n >= 1000:
            return f"{n // 1000}.{(n % 1000) // 100}.{n % 100}"
    return None
