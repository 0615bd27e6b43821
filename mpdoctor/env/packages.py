"""Installed versions of the libraries that matter for mixed precision.

Read through `importlib.metadata` (what pip reads), which imports nothing:
`accelerate`'s version must not cost `import accelerate`. For the libraries whose
requirements the rules compare (accelerate needs torch>=X, torch pins its nvidia-*
wheels), the declared Requires-Dist lines are kept too.

`installed()` uses the standard library only: the torch child loads this file by path
inside the interpreter that trains (`--python`), where mpdoctor may not be installed,
and sends its answer back; `collect_packages()` shapes it into the snapshot section.
"""

from __future__ import annotations

import re
from typing import Any

TRACKED = (
    "torch", "torchvision", "torchaudio", "triton", "numpy",
    "accelerate", "transformers", "deepspeed", "bitsandbytes", "flash-attn", "xformers",
    "transformer-engine", "transformer-engine-torch", "transformer-engine-cu12", "transformer-engine-cu13",
    "torchao", "msamp", "ms-amp", "apex", "peft", "diffusers", "lightning", "pytorch-lightning",
    "nvidia-ml-py", "pynvml", "pyyaml", "safetensors",
)
# Whose Requires-Dist lines the rules read, and which requirements of theirs matter.
REQUIREMENTS_OF = ("torch", "accelerate", "transformers", "deepspeed", "peft", "diffusers", "lightning",
                   "pytorch-lightning", "bitsandbytes", "torchao", "flash-attn", "xformers", "torchvision",
                   "torchaudio", "transformer-engine-torch")
_RELEVANT_DEPS = ("torch", "accelerate", "transformers", "triton", "numpy", "deepspeed", "peft")
_MAX_REQUIRES = 400  # Requires-Dist lines kept per package (torch has ~40)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _headers(dist: Any) -> dict[str, list[str]] | None:
    """The metadata headers (up to the first blank line), read as text: the email
    parser behind `dist.metadata` costs 30x more and reads the whole description."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            text = dist.read_text(name)
        except Exception:
            text = None
        if text is None:
            continue
        out: dict[str, list[str]] = {}
        for line in text.splitlines()[:2000]:
            if not line.strip():
                break
            if line[:1] in " \t":
                continue  # a folded continuation line (long descriptions only)
            field, sep, value = line.partition(":")
            if sep:
                out.setdefault(field.strip().lower(), []).append(value.strip())
        return out
    return None


def installed(path: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """normalised name -> {"version", "requires"} for the tracked libraries and every
    nvidia-* wheel; the first on sys.path wins, as for import. Standard library only."""
    from importlib import metadata

    wanted = set(TRACKED) | set(REQUIREMENTS_OF)
    found: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for dist in metadata.distributions(**({"path": path} if path is not None else {})):
        try:
            name = getattr(dist, "_normalized_name", None) or ((_headers(dist) or {}).get("name") or [""])[0]
        except Exception:  # a broken dist-info folder: skip it, as pip does
            continue
        if not name:
            continue
        key = _normalise(str(name))
        if key in seen:
            continue
        seen.add(key)
        if key not in wanted and not key.startswith("nvidia-"):
            continue
        head = _headers(dist)
        if head is None:
            continue
        version = (head.get("version") or [""])[0]
        requires = head.get("requires-dist", [])[:_MAX_REQUIRES] if key in REQUIREMENTS_OF else []
        found[key] = {"version": version, "requires": requires}
    return found


def _requires(lines: list[str]) -> list[str]:
    from ..knowledge.versions import parse_requires_dist

    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for req in lines:
        parsed = parse_requires_dist(str(req).strip())
        # A bare name ("peft; extra == 'dev'") constrains nothing: keep only specifiers.
        if parsed and parsed[1] and (parsed[0] in _RELEVANT_DEPS or parsed[0].startswith("nvidia-")):
            if (parsed[0], parsed[1]) not in seen:  # the same pin repeats under every extra
                seen.add((parsed[0], parsed[1]))
                out.append(str(req).strip())
    return out


def collect_packages(raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"versions": {name: version}, "nvidia_wheels": {...}, "requires": {name: [lines]}}
    from `installed()` of this interpreter, or of another one (`raw`, its answer)."""
    found = installed() if raw is None else raw
    found = {str(k): v for k, v in found.items() if isinstance(v, dict)}
    versions = {name: str(found[name].get("version", "")) for name in TRACKED if name in found}
    nvidia = {name: str(v.get("version", "")) for name, v in sorted(found.items())
              if name.startswith("nvidia-") and name not in ("nvidia-ml-py",)}
    requires = {name: _requires(list(found[name].get("requires") or [])) for name in REQUIREMENTS_OF if name in found}
    return {"versions": versions, "nvidia_wheels": nvidia, "requires": {k: v for k, v in requires.items() if v}}
