"""The accelerate configuration as `accelerate launch` would read it, and the
environment variables that set precision and devices.

Only `accelerate launch` reads the config file; a plain `python train.py` sees only
the environment. Both are recorded so that the precision plan can say what each way
of starting the script would get. The DeepSpeed JSON a config points to is read too:
with DeepSpeed, its fp16/bf16 blocks decide the precision.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

ENV_PREFIXES = ("ACCELERATE_", "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "NVIDIA_", "CUDNN_", "HIP_",
                "ROCR_", "HSA_", "HF_", "FSDP_", "DS_", "MASTER_", "XLA_", "WORLD_SIZE", "LOCAL_RANK",
                "RANK", "OMP_NUM_THREADS", "LD_LIBRARY_PATH", "XDG_CACHE_HOME")


def default_config_path(env: dict[str, str] | None = None) -> str:
    """$HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface (~/.cache/huggingface): accelerate's own rule."""
    env = os.environ if env is None else env
    hf_home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(hf_home), "accelerate", "default_config.yaml")


def collect_env_vars(env: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


class ConfigParseError(ValueError):
    pass


# YAML 1.1 booleans, as PyYAML (and so accelerate) reads them: an unquoted `no` is False.
_SCALARS = {"true": True, "false": False, "null": None, "~": None, "": None, "yes": True, "no": False,
            "on": True, "off": False}
_NUM = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


def _scalar(text: str) -> Any:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t == "[]":
        return []
    if t == "{}":
        return {}
    low = t.lower()
    if low in _SCALARS:
        return _SCALARS[low]
    if _NUM.match(t):
        return int(t)
    if _FLOAT.match(t):
        return float(t)
    return t


def parse_simple_yaml(text: str) -> dict[str, Any]:
    """The YAML subset accelerate writes (nested mappings, '- ' lists, plain and quoted
    scalars), for machines without PyYAML. Raises ConfigParseError."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, Any]] = [(-1, root)]
    pending_key: list[tuple[int, dict, str]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() == "---":
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        while stack and indent <= stack[-1][0] and len(stack) > 1:
            stack.pop()
        if pending_key and indent > pending_key[-1][0]:
            pindent, pdict, pkey = pending_key.pop()
            container: Any = [] if body.startswith("- ") or body == "-" else {}
            pdict[pkey] = container
            stack.append((pindent, container))
        elif pending_key:
            pindent, pdict, pkey = pending_key.pop()
            pdict[pkey] = None
        parent = stack[-1][1]
        if body.startswith("- ") or body == "-":
            if not isinstance(parent, list):
                raise ConfigParseError(f"line {no}: a list item where a key was expected")
            parent.append(_scalar(body[2:]))
            continue
        if ":" not in body:
            raise ConfigParseError(f"line {no}: expected 'key: value', got {body!r}")
        key, _, value = body.partition(":")
        if not isinstance(parent, dict):
            raise ConfigParseError(f"line {no}: a key inside a list is not supported")
        key = key.strip().strip("'\"")
        if value.strip() == "":
            pending_key.append((indent, parent, key))
            parent[key] = None
        else:
            parent[key] = _scalar(value)
    return root


def parse_config_text(text: str, path: str) -> dict[str, Any]:
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigParseError(f"not valid JSON: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:
            data = parse_simple_yaml(text)
        else:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigParseError(f"not valid YAML: {exc}".replace("\n", " ")) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigParseError(f"the top level is a {type(data).__name__}, not a mapping of settings")
    return data


def _read_deepspeed(path: str, base_dir: str) -> dict[str, Any]:
    full = os.path.expanduser(path)
    if not os.path.isabs(full):
        # accelerate passes the path on as given: relative to where `accelerate launch` runs.
        full = os.path.abspath(full)
    out: dict[str, Any] = {"path": path, "resolved_path": full, "exists": os.path.isfile(full)}
    if not out["exists"]:
        return out
    try:
        with open(full, encoding="utf-8") as fh:
            data = json.load(fh)
        out["config"] = data if isinstance(data, dict) else {}
        if not isinstance(data, dict):
            out["error"] = {"type": "ConfigParseError", "message": "the top level is not a JSON object"}
    except (OSError, ValueError) as exc:
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
    return out


def collect_accelerate_config(config_file: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The `accelerate_config` section: where the file is, whether it exists, what it says."""
    env = os.environ if env is None else env
    if config_file:
        path, source = config_file, "--config-file"
    else:
        path, source = default_config_path(env), "default"
    full = os.path.expanduser(path)
    out: dict[str, Any] = {"path": path, "source": source, "exists": os.path.isfile(full)}
    if not out["exists"]:
        return out
    try:
        with open(full, encoding="utf-8") as fh:
            text = fh.read()
        out["config"] = parse_config_text(text, full)
    except (OSError, UnicodeDecodeError) as exc:
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
        return out
    except ConfigParseError as exc:
        out["error"] = {"type": "ConfigParseError", "message": str(exc)}
        return out
    ds = out["config"].get("deepspeed_config")
    if isinstance(ds, dict) and ds.get("deepspeed_config_file"):
        out["deepspeed"] = _read_deepspeed(str(ds["deepspeed_config_file"]), os.path.dirname(full))
    return out
