"""What follows from the platform a log names when it is not CUDA: an AMD GPU's gfx
architecture (read from the log, or looked up from a Radeon/Instinct name) and what the
ROCm builds do with it, and which platform wording a distributed or memory error came in.

Pure functions, no torch; derivers never raise.
"""

from __future__ import annotations

import re
from typing import Any

# Marketing name -> gfx ISA (AMD's LLVM target table; the cards users paste most).
_AMD_NAMES: tuple[tuple[str, str], ...] = (
    (r"rx\s?69[05]0|rx\s?6800", "gfx1030"),
    (r"rx\s?67[05]0", "gfx1031"),
    (r"rx\s?66[05]0", "gfx1032"),
    (r"rx\s?6[54]00", "gfx1034"),
    (r"680m|660m", "gfx1035"),
    (r"rx\s?7900", "gfx1100"),
    (r"rx\s?7[87]00", "gfx1101"),
    (r"rx\s?7600", "gfx1102"),
    (r"780m|760m", "gfx1103"),
    (r"8060s|8050s|ai max", "gfx1151"),
    (r"rx\s?9070", "gfx1201"),
    (r"rx\s?9060", "gfx1200"),
    (r"rx\s?(?:4[78]0|5[789]0)|wx\s?[47]100|wx\s?5100", "gfx803"),
    (r"vega\s?(?:56|64)", "gfx900"),
    (r"radeon\s?vii|mi50|mi60", "gfx906"),
    (r"mi100", "gfx908"),
    (r"mi2[15]0", "gfx90a"),
    (r"mi300", "gfx942"),
)

# gfx -> (the override that makes the runtime load a listed architecture's code objects,
#         what to say about the family). HSA_OVERRIDE_GFX_VERSION works only inside one ISA
#         family: RDNA2 cards run gfx1030 code, RDNA3/3.5 cards run gfx1100 code.
_RDNA2 = ("10.3.0", "an RDNA2 GPU: torch's ROCm builds carry code for gfx1030 only, which runs on the whole RDNA2 family once the runtime is told to load it")
_RDNA3 = ("11.0.0", "an RDNA3 GPU: torch's ROCm builds carry code for gfx1100 (older builds list only that one of the family), which runs on the other RDNA3 chips once the runtime is told to load it")
_OLD = (None, "an architecture that current ROCm releases and torch's ROCm wheels no longer build for, and no override can make another ISA's code run on it")
_DC = (None, "a data-centre GPU that torch's official ROCm wheels do build for: a build without it is a custom or third-party one, or one for another ROCm release")


def _family(gfx: str) -> tuple[str | None, str] | None:
    g = gfx.lower()
    if g == "gfx1030":
        return (None, "the RDNA2 chip torch's ROCm builds are made for: a build without it is a custom one, or a library with its own kernels was built for other GPUs")
    if re.fullmatch(r"gfx103[1-6]", g):
        return _RDNA2
    if g == "gfx1100":
        return (None, "the RDNA3 chip torch's ROCm builds are made for: a build without it is a custom one, or a library with its own kernels was built for other GPUs")
    if re.fullmatch(r"gfx110[1-3]|gfx115[0-3]", g):
        return _RDNA3
    if re.fullmatch(r"gfx120[01]", g):
        return (None, "an RDNA4 GPU: only recent ROCm builds of torch (ROCm 6.4 and later) carry code for it")
    if re.fullmatch(r"gfx80[0-9]|gfx90[0-2]|gfx101[0-2]", g):
        return _OLD
    if re.fullmatch(r"gfx90[68a]|gfx94[0-2]|gfx950", g):
        return _DC
    return None


def gfx_of_name(name: str | None) -> str | None:
    """'AMD Radeon RX 6700 XT' -> 'gfx1031'; None for a name not in the table."""
    if not name:
        return None
    low = str(name).lower()
    for rx, gfx in _AMD_NAMES:
        if re.search(rx, low):
            return gfx
    return None


def hip_arch_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts of an AMD GPU that has no code objects in the build: its gfx name (read,
    or looked up from its marketing name), the HSA_OVERRIDE_GFX_VERSION that applies, and
    a sentence on its family."""
    out: dict[str, Any] = {}
    gfx = facts.get("gfx_arch")
    if gfx:
        gfx = str(gfx).split(":")[0].lower()
        out["_gfx_source"] = " (named in the log)"
    else:
        gfx = gfx_of_name(facts.get("amd_gpu"))
        if gfx:
            out["_gfx_source"] = f" (looked up from the name {facts['amd_gpu']})"
    if not gfx:
        return out
    out["gfx_arch"] = gfx
    fam = _family(gfx)
    if fam:
        override, note = fam
        out["gfx_note"] = note
        if override:
            out["hsa_override"] = override
        if fam is _OLD:
            out["_gfx_dropped"] = gfx
    return out
