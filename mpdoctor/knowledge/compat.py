"""The compatibility tables (mpdoctor/knowledge/tables/*.toml) and the questions the rules
ask of them. Data lives in the TOML files with its sources; this module only reads."""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .versions import compare, release, satisfies

TABLES = Path(__file__).with_name("tables")
Capability = tuple[int, int]


@lru_cache(maxsize=None)
def table(name: str) -> dict[str, Any]:
    with (TABLES / f"{name}.toml").open("rb") as fh:
        return tomllib.load(fh)


def sources() -> dict[str, str]:
    return dict(table("sources")["sources"])


def parse_cc(text: str | list | tuple | None) -> Capability | None:
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        return (int(text[0]), int(text[1])) if len(text) >= 2 else None
    m = re.match(r"^(\d+)\.(\d+)$", str(text).strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def sm(cc: Capability) -> str:
    return f"sm_{cc[0]}{cc[1]}"


# --- GPUs ---------------------------------------------------------------------------

def gpu_by_name(name: str | None) -> dict[str, Any] | None:
    if not name:
        return None
    for row in table("gpus")["gpu"]:
        if re.search(row["pattern"], name, re.IGNORECASE):
            return row
    return None


def arch_name(cc: Capability | None, name: str | None = None) -> str | None:
    row = gpu_by_name(name)
    if row and (cc is None or parse_cc(row["cc"]) == cc):
        return row["arch"]
    if cc is None:
        return None
    if cc == (7, 5):
        return "Turing"
    if cc[0] == 7:
        return "Volta"
    if cc[0] == 8:
        return "Ada Lovelace" if cc >= (8, 9) else "Ampere"
    return table("gpus")["arch_by_major"].get(str(cc[0]))


def features(cc: Capability) -> dict[str, Any]:
    """The precision row for a capability: exact, else the closest lower of that major."""
    rows = [(parse_cc(r["cc"]), r) for r in table("precision")["capability"]]
    best = None
    for rcc, row in rows:
        if rcc and rcc <= cc and (best is None or rcc > best[0]):
            if rcc[0] == cc[0] or best is None or rcc[0] > best[0][0]:
                best = (rcc, row)
    return dict(best[1]) if best else {}


def rocm_target(gcn_arch: str | None) -> dict[str, Any] | None:
    if not gcn_arch:
        return None
    base = gcn_arch.split(":")[0]
    for row in table("precision")["rocm"]:
        if row["gfx"] == base:
            return row
    return None


# --- drivers ------------------------------------------------------------------------

def toolkit_min_driver(cuda: str, windows: bool = False) -> str | None:
    want = release(cuda)
    if not want:
        return None
    key = "windows" if windows else "linux"
    for row in table("cuda_drivers")["toolkit"]:
        if release(row["cuda"])[:2] == want[:2]:
            return row.get(key)
    return None


def family_floor(cuda: str, windows: bool = False) -> str | None:
    """The minor-version-compatibility floor of the build's CUDA major (None for 10.x)."""
    want = release(cuda)
    if not want:
        return None
    key = "windows" if windows else "linux"
    if want[:2] == (11, 0):
        return "451.22" if windows else "450.36.06"
    for row in table("cuda_drivers")["family"]:
        if row["major"] == want[0]:
            return row.get(key)
    return None


def driver_max_cuda(driver: str, windows: bool = False) -> str | None:
    """The newest toolkit whose GA driver minimum this driver meets (Table 3)."""
    key = "windows" if windows else "linux"
    best = None
    for row in table("cuda_drivers")["toolkit"]:
        need = row.get(key)
        if need and compare(driver, need) is not None and compare(driver, need) >= 0:
            if best is None or compare(row["cuda"], best) > 0:
                best = row["cuda"]
    return best


def arch_support(cc: Capability) -> dict[str, Any] | None:
    for row in table("cuda_drivers")["arch_support"]:
        if any(parse_cc(c) == cc for c in row["cc"]):
            return row
    return None


# --- architectures in a build ----------------------------------------------------------

_TEGRA_ONLY = {(5, 3), (6, 2), (7, 2), (8, 7)}
_ENTRY = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def entry_cc(digits: str) -> Capability:
    return (int(digits[:-1]), int(digits[-1]))


def arch_coverage(cc: Capability, arch_list: list[str]) -> tuple[str | None, str | None]:
    """How a build covers a device: ("sass", "sm_80"), ("ptx", "compute_90") or (None, None).

    SASS runs on the same major and an equal or higher minor, except on the Tegra parts
    (5.3, 6.2, 7.2, 8.7), which only their own SASS covers; `a` targets run on exactly
    their capability, `f` targets on their family (same major). PTX runs on any equal or
    newer capability, compiled by the driver at first launch. (S-TORCHCUDA, S-MODALCC)
    """
    best_sass, best_ptx = None, None
    for raw in arch_list:
        m = _ENTRY.match(raw.strip())
        if not m:
            continue
        kind, digits, suffix = m.groups()
        ecc = entry_cc(digits)
        if kind == "compute":
            if ecc <= cc and suffix == "":
                best_ptx = raw
            continue
        if suffix == "a":
            ok = ecc == cc
        elif ecc[0] != cc[0] or ecc[1] > cc[1]:
            ok = False
        elif cc in _TEGRA_ONLY or ecc in _TEGRA_ONLY:
            ok = ecc == cc
        else:
            ok = True
        if ok:
            best_sass = raw
    if best_sass:
        return "sass", best_sass
    if best_ptx:
        return "ptx", best_ptx
    return None, None


def builds_covering(cc: Capability, limit: int = 3) -> list[str]:
    """Newest published pip builds with SASS for this capability, e.g. "torch 2.6-2.13 cu126"."""
    def newest_first(row: dict[str, Any]) -> tuple:
        hi = re.search(r"<([\d.]+)", row["torch"])
        return (release(hi.group(1)) if hi else (99,), row["variant"])

    out = []
    for row in sorted(table("torch_builds")["build"], key=newest_first, reverse=True):
        archs = [f"sm_{a.replace('.', '')}" for a in row["archs"]]
        if row.get("ptx"):
            archs.append(f"compute_{row['archs'][-1].replace('.', '')}")
        if arch_coverage(cc, archs)[0] == "sass":
            spec = row["torch"]
            lo = re.search(r">=([\d.]+)", spec)
            hi = re.search(r"<([\d.]+)", spec)
            if lo and hi:
                top = release(hi.group(1))
                last = f"{top[0]}.{top[1] - 1}" if top and top[1] > 0 else hi.group(1)
                rng = lo.group(1) if lo.group(1) == last else f"{lo.group(1)}-{last}"
            else:
                rng = spec
            out.append(f"torch {rng} {row['variant']}")
    return out[:limit]


def removed_by_toolkit(cc: Capability) -> str | None:
    """The CUDA release that removed this capability's target, e.g. "12.0" for sm_37."""
    for row in table("torch_builds")["removed"]:
        if any(parse_cc(a) == cc for a in row["archs"]):
            return row["cuda"]
    return None


# --- libraries -------------------------------------------------------------------------

def accelerate_torch_min(accelerate: str) -> str | None:
    for row in table("libraries")["accelerate_torch"]:
        if satisfies(accelerate, row["accelerate"]):
            return row["torch"]
    return None


def fp8_backends() -> list[dict[str, Any]]:
    return [dict(r) for r in table("libraries")["fp8_backend"]]


def accelerate_device_outcome(mode: str, device: str, accelerate: str | None, torch: str | None) -> dict[str, Any] | None:
    for row in table("libraries")["accelerate_device"]:
        if row["mode"] != mode or row["device"] != device:
            continue
        if accelerate and satisfies(accelerate, row["accelerate"]) is False:
            continue
        if "torch" in row and (torch is None or satisfies(torch, row["torch"]) is not True):
            continue
        return dict(row)
    return None


def alloc_conf() -> dict[str, Any]:
    return dict(table("libraries")["alloc_conf"])
