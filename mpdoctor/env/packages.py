"""Installed versions of the libraries that matter for mixed precision.

Read from the `*.dist-info` folder names on sys.path (what `pip list` reads), which
is fast and imports nothing: `accelerate`'s version must not cost `import accelerate`.
For the libraries whose requirements the rules compare (accelerate needs torch>=X,
torch pins its nvidia-* wheels), the declared Requires-Dist lines are kept too.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..knowledge.versions import normalise_name, parse_requires_dist

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


def _scan() -> dict[str, tuple[str, str]]:
    """normalised name -> (version, dist-info path); the first on sys.path wins, as for import."""
    found: dict[str, tuple[str, str]] = {}
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for fname in names:
            if fname.endswith(".dist-info"):
                stem = fname[: -len(".dist-info")]
                name, _, version = stem.partition("-")
            elif fname.endswith(".egg-info"):
                stem = fname[: -len(".egg-info")]
                name, _, rest = stem.partition("-")
                version = rest.split("-py")[0]
            else:
                continue
            key = normalise_name(name)
            if key in found:
                continue
            path = os.path.join(entry, fname)
            if not version:
                version = _version_from_metadata(path) or ""
            found[key] = (version, path)
    return found


def _metadata_lines(path: str) -> list[str]:
    for meta in ("METADATA", "PKG-INFO"):
        p = os.path.join(path, meta)
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8", errors="replace") as fh:
                    head = []
                    for line in fh:
                        if not line.strip():  # headers end at the first blank line
                            break
                        head.append(line.rstrip("\n"))
                    return head
            except OSError:
                return []
    return []


def _version_from_metadata(path: str) -> str | None:
    for line in _metadata_lines(path):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def _requires(path: str) -> list[str]:
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in _metadata_lines(path):
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        parsed = parse_requires_dist(req)
        # A bare name ("peft; extra == 'dev'") constrains nothing: keep only specifiers.
        if parsed and parsed[1] and (parsed[0] in _RELEVANT_DEPS or parsed[0].startswith("nvidia-")):
            if (parsed[0], parsed[1]) not in seen:  # the same pin repeats under every extra
                seen.add((parsed[0], parsed[1]))
                out.append(req)
    return out


def collect_packages() -> dict[str, Any]:
    """{"versions": {name: version}, "nvidia_wheels": {...}, "requires": {name: [lines]}}"""
    found = _scan()
    versions = {name: found[name][0] for name in TRACKED if name in found}
    nvidia = {name: v for name, (v, _p) in sorted(found.items())
              if name.startswith("nvidia-") and name not in ("nvidia-ml-py",)}
    requires = {name: _requires(found[name][1]) for name in REQUIREMENTS_OF if name in found}
    return {"versions": versions, "nvidia_wheels": nvidia, "requires": {k: v for k, v in requires.items() if v}}
