"""The accelerate configuration as `accelerate launch` would read it, and the
environment variables that set precision and devices.

Only `accelerate launch` reads the config file; a plain `python train.py` sees only
the environment. Both are recorded so that the precision plan can say what each way
of starting the script would get. The DeepSpeed JSON a config points to is read too:
with DeepSpeed, its fp16/bf16 blocks decide the precision.

Both files are read bounded: a size cap, PyYAML's safe loader with limits on depth,
aliases and expanded size (a billion-laughs file costs no more than its bytes), JSON
with a depth limit. A file that cannot be read says why, with a line and column where
the parser gives one, and never quotes the offending line: it may hold a token.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..knowledge import intent

ENV_PREFIXES = ("ACCELERATE_", "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "NVIDIA_", "CUDNN_", "HIP_",
                "ROCR_", "HSA_", "HF_", "FSDP_", "DS_", "MASTER_", "XLA_", "WORLD_SIZE", "LOCAL_RANK",
                "RANK", "OMP_NUM_THREADS", "LD_LIBRARY_PATH", "XDG_CACHE_HOME")


def default_config_path(env: dict[str, str] | None = None) -> str:
    """$HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface (~/.cache/huggingface): accelerate's own rule (one
    source: knowledge.intent, which the run side uses too)."""
    return intent.default_config_path(env)


def collect_env_vars(env: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


class ConfigParseError(ValueError):
    pass


# A config file is a few hundred bytes; these bound what a hostile or broken one costs.
MAX_BYTES = 1024 * 1024       # a JSON file larger than this: "too large to read"
MAX_YAML_BYTES = 256 * 1024   # YAML is parsed in pure Python (~4 s/MB): a tighter cap
MAX_DEPTH = 50                # nesting levels (accelerate writes 3)
MAX_NODES = 100_000           # values, counting each alias expansion (billion laughs)
MAX_ALIASES = 1_000


def _depth_and_size(data: Any, what: str) -> None:
    """Raise ConfigParseError if `data` nests deeper than MAX_DEPTH or holds more than
    MAX_NODES values, walking without recursion and stopping at the first excess."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    count = 0
    while stack:
        obj, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigParseError(f"{what} holds more than {MAX_NODES:,} values")
        if isinstance(obj, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigParseError(f"{what} is nested more than {MAX_DEPTH} levels deep")
            items = obj.values() if isinstance(obj, dict) else obj
            stack.extend((v, depth + 1) for v in items)


def _yaml_problem(exc: Exception) -> str:
    """Where and what, never the offending line itself (it may hold a secret): the
    YAML error's own text quotes the line under a caret."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    kind = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    kind = " ".join(str(kind).split())[:100]
    if mark is not None:
        return f"not valid YAML: {kind} (line {mark.line + 1}, column {mark.column + 1})"
    return f"not valid YAML: {kind}"


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, bounded: the composed document is checked for depth, alias
    count and expanded size before any Python object is built from it, so that
    neither a deeply nested file nor a billion-laughs one costs more than its bytes.
    Raises ConfigParseError."""
    try:
        import yaml
        from yaml.events import AliasEvent
    except ImportError:  # a --no-deps install: PyYAML is a dependency of mpdoctor (and of accelerate)
        raise ConfigParseError("PyYAML is not installed where mpdoctor runs (pip install pyyaml)") from None

    class BoundedLoader(yaml.SafeLoader):
        depth = 0
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
            if self.check_event(AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise ConfigParseError(f"the config uses more than {MAX_ALIASES} YAML aliases")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ConfigParseError(f"the config is nested more than {MAX_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigParseError(_yaml_problem(exc)) from None
    except RecursionError:
        raise ConfigParseError(f"the config is nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def _expanded_size(node: Any) -> None:
    """Count the values of a composed YAML document as they would be built, each alias
    counting as a full copy of its anchor, up to MAX_NODES (then stop)."""
    from yaml.nodes import CollectionNode, MappingNode

    stack = [node]
    count = 0
    while stack:
        n = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigParseError(f"the config holds more than {MAX_NODES:,} values "
                                   "(each YAML alias counted as a copy of its anchor)")
        if isinstance(n, MappingNode):
            for k, v in n.value:
                stack.append(k)
                stack.append(v)
        elif isinstance(n, CollectionNode):
            stack.extend(n.value)


def load_json(text: str, what: str = "the config") -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:  # its message names the position, not the text
        raise ConfigParseError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ConfigParseError(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # a number of more than 4300 digits
        raise ConfigParseError(f"not valid JSON: {str(exc).splitlines()[0][:100]}") from None
    _depth_and_size(data, what)
    return data


def parse_config_text(text: str, path: str) -> dict[str, Any]:
    """The settings of an accelerate config file. YAML (accelerate's `.yaml`, which may
    hold JSON: `accelerate config default` writes JSON) or `.json`, as accelerate
    decides by the file's extension. Raises ConfigParseError."""
    if path.endswith(".json"):
        data = load_json(text)
    else:
        data = load_yaml(text)
        _depth_and_size(data, "the config")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigParseError(f"the top level is a {type(data).__name__}, not a mapping of settings")
    return data


def read_capped(path: str, what: str, limit: int = MAX_BYTES) -> str:
    """The text of a config file of at most `limit` bytes. Raises ConfigParseError
    (too large, not UTF-8) or OSError."""
    with open(path, "rb") as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise ConfigParseError(f"{what} is too large to read (more than {limit // 1024} KiB; "
                               "a config is a few KiB)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigParseError(f"{what} is not UTF-8 text (byte {exc.start})") from None


def _read_deepspeed(path: str, base_dir: str) -> dict[str, Any]:
    full = os.path.expanduser(path)
    if not os.path.isabs(full):
        # accelerate passes the path on as given: relative to where `accelerate launch` runs.
        full = os.path.abspath(full)
    out: dict[str, Any] = {"path": path, "resolved_path": full, "exists": os.path.isfile(full)}
    if not out["exists"]:
        return out
    try:
        data = load_json(read_capped(full, "the DeepSpeed config"), "the DeepSpeed config")
        out["config"] = data if isinstance(data, dict) else {}
        if not isinstance(data, dict):
            out["error"] = {"type": "ConfigParseError", "message": "the top level is not a JSON object"}
    except ConfigParseError as exc:
        out["error"] = {"type": "ConfigParseError", "message": str(exc)}
    except OSError as exc:
        out["error"] = {"type": type(exc).__name__, "message": exc.strerror or str(exc)}
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
        if os.path.exists(full):  # a FIFO or a device would block or never end: not opened
            out["exists"] = True
            out["error"] = {"type": "ConfigParseError", "message": "not a regular file"}
        return out
    try:
        limit = MAX_BYTES if full.endswith(".json") else MAX_YAML_BYTES
        out["config"] = parse_config_text(read_capped(full, "the config file", limit), full)
    except OSError as exc:
        out["error"] = {"type": type(exc).__name__, "message": exc.strerror or str(exc)}
        return out
    except ConfigParseError as exc:
        out["error"] = {"type": "ConfigParseError", "message": str(exc)}
        return out
    except Exception as exc:  # MemoryError, a loader bug: still a file that exists and cannot be read
        out["error"] = {"type": type(exc).__name__, "message": f"the file could not be parsed ({type(exc).__name__})"}
        return out
    ds = out["config"].get("deepspeed_config")
    if isinstance(ds, dict) and ds.get("deepspeed_config_file"):
        out["deepspeed"] = _read_deepspeed(str(ds["deepspeed_config_file"]), os.path.dirname(full))
    return out
