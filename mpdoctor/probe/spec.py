"""`probe --model SPEC`, read on the parent side (no torch, no user code imported here).

A SPEC is one of:

- a built-in model: ``transformer`` (default), ``mlp``, ``conv``;
- ``package.module:factory``: a function (or class) importable from the current
  directory or ``sys.path``, called with no arguments;
- ``path/to/file.py:factory``, or ``path/to/file.py`` alone (its ``make_model``,
  ``build_model``, ``create_model``, ``get_model`` or ``model``);
- a transformers ``config.json`` (the model is built from it, randomly initialised,
  with the Hub offline: nothing is downloaded);
- a ``save_pretrained`` folder (``config.json`` and, if present, the weights beside
  it: the model is loaded from the folder with its trained weights, offline).

The factory returns the model, or ``(model, batch)``, or ``(model, batch, loss_fn)``; a
batch is a tensor, a tuple/list of positional inputs, or a dict of keyword inputs;
``loss_fn(output)`` or ``loss_fn(output, batch)`` returns the scalar loss. The child
(mpdoctor/probe/usermodel.py) builds it; here the SPEC is only parsed and checked, so
that a wrong one is an exit 2 before any child starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

from ..redact import clip

BUILTIN = ("transformer", "mlp", "conv")
DEFAULT_FACTORIES = ("make_model", "build_model", "create_model", "get_model", "model")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class ModelSpecError(ValueError):
    """A --model SPEC that cannot be a model: said in one line, exit status 2."""


def parse_model_spec(text: str) -> dict[str, Any]:
    """The SPEC as the child needs it: {"kind": "builtin"|"config"|"pretrained"|"file"|"module", ...}."""
    text = (text or "").strip()
    if not text:
        raise ModelSpecError("--model: empty SPEC")
    if text in BUILTIN:
        return {"kind": "builtin", "name": text, "spec": text}
    folder = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(folder):
        return _folder_spec(text, folder)
    path, _, factory = text, "", ""
    # `C:\x\m.py:make` on Windows has two colons: the factory is after the last one.
    if ":" in text and not text.endswith((".py", ".json")):
        path, _, factory = text.rpartition(":")
        if not _IDENT.match(factory):
            raise ModelSpecError(f"--model {text}: {factory!r} is not a function name")
    if path.endswith(".json"):
        return _config_spec(text, path)
    if path.endswith(".py") or os.sep in path or "/" in path:
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(full):
            raise ModelSpecError(f"--model {text}: no such file {path!r}")
        return {"kind": "file", "path": full, "factory": factory or None, "spec": text}
    if not factory:
        raise ModelSpecError(f"--model {text}: not a built-in model ({', '.join(BUILTIN)}), a "
                             "package.module:factory, a path/to/file.py[:factory], a config.json or a "
                             "`save_pretrained` folder")
    if not _DOTTED.match(path):
        raise ModelSpecError(f"--model {text}: {path!r} is not a module name")
    top = path.split(".", 1)[0]
    try:  # only the top-level name: finding a submodule would import the package
        import sys

        cwd = os.getcwd()
        if cwd not in sys.path:  # the child can import from the current directory (as `python -m` does)
            sys.path.insert(0, cwd)
            try:
                found = importlib.util.find_spec(top)
            finally:
                sys.path.remove(cwd)
        else:
            found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ModelSpecError(f"--model {text}: no module named {top!r} here or on sys.path")
    return {"kind": "module", "module": path, "factory": factory, "spec": text}


def _config_spec(text: str, path: str) -> dict[str, Any]:
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        full = os.path.join(full, "config.json")
    if not os.path.isfile(full):
        raise ModelSpecError(f"--model {text}: no such file {path!r}")
    if os.path.getsize(full) > 16 * 1024 * 1024:
        raise ModelSpecError(f"--model {text}: {path!r} is over 16 MiB; a model config is a few KiB")
    try:
        with open(full, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelSpecError(f"--model {text}: not a JSON file ({type(exc).__name__}: {clip(str(exc), 120)})") from None
    if not isinstance(data, dict) or not (isinstance(data.get("model_type"), str) or data.get("architectures")):
        raise ModelSpecError(f"--model {text}: not a transformers config (no \"model_type\" or \"architectures\")")
    if importlib.util.find_spec("transformers") is None:
        raise ModelSpecError(f"--model {text}: a config.json needs transformers, which is not installed here")
    return {"kind": "config", "path": full, "model_type": data.get("model_type"),
            "architectures": data.get("architectures"), "spec": text}


WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _folder_spec(text: str, folder: str) -> dict[str, Any]:
    """A folder made by `save_pretrained` (the Hugging Face convention): its config.json,
    and its weights when they are there (loaded, so the activations are the trained
    model's; without weights the model is built from the config)."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelSpecError(f"--model {text}: the folder {text!r} has no config.json (a `save_pretrained` "
                             "folder has one)")
    spec = _config_spec(text, os.path.join(folder, "config.json"))
    weights = [w for w in WEIGHTS if os.path.isfile(os.path.join(folder, w))]
    spec.update(kind="pretrained" if weights else "config", folder=folder, weights=weights[0] if weights else None)
    return spec


def describe_spec(spec: dict[str, Any]) -> str:
    return str(spec.get("spec") or spec.get("name"))


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """`2G`, `1.5GiB`, `800M`, `123456789` -> bytes (G/M/K alone are binary, as ulimit's)."""
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 2G, 800M, 1.5GiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text!r} is not a size above zero")
    return int(value)
