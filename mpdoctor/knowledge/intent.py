"""Precision intent: the places a precision can be asked for, and which one wins, by
the libraries' own precedence (read in their sources, accelerate 1.16, transformers 5):

- `accelerate launch`: a flag (`--mixed_precision`) wins over the config file
  (commands/launch.py `_validate_launch_command` fills only the arguments not given);
  without either the launcher says "no". It then *sets* ACCELERATE_MIXED_PRECISION for the
  script (utils/launch.py), overwriting any value the shell had.
- `Accelerator(mixed_precision=X)`: an explicit argument wins over the environment;
  ACCELERATE_MIXED_PRECISION is read only when the argument is None (state.py).
- transformers' TrainingArguments: `fp16=True` / `bf16=True` win over the environment
  (training_args.py), and the Trainer passes the result to its Accelerator explicitly.

Codes only: the rules say them in words. Both the check side (env/plan.py) and the run
side (the instrumentation's plan, the run checks) use this one table.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

# The sources, as codes (rules/run/intent-*.toml and precision-plan.toml word them).
LAUNCH_FLAG = "launch_flag"            # accelerate launch --mixed_precision X
CONFIG_FILE = "config_file"            # the accelerate config file (read by accelerate launch)
ENV = "env"                            # ACCELERATE_MIXED_PRECISION
ACCELERATOR_ARG = "accelerator_arg"    # Accelerator(mixed_precision=X) in the code
TRAINER_ARGS = "trainer_args"          # TrainingArguments(fp16=/bf16=) through the Trainer
OUTER = (LAUNCH_FLAG, CONFIG_FILE, ENV)  # what the code's own arguments override
CODE = (ACCELERATOR_ARG, TRAINER_ARGS)

_CONFIG_LINE = re.compile(r"^mixed_precision\s*:\s*['\"]?([A-Za-z0-9_]+)", re.MULTILINE)
_MAX_CONFIG = 256 * 1024


def default_config_path(env: Any = None) -> str:
    """$HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface (~/.cache/huggingface): accelerate's own rule."""
    env = os.environ if env is None else env
    hf_home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(hf_home), "accelerate", "default_config.yaml")


def mode(value: Any) -> str | None:
    """A precision value as accelerate's launcher and Accelerator() use it: lower-cased
    (YAML's unquoted `no` is False)."""
    if value is None:
        return None
    if value is False:
        return "no"
    text = str(value).strip().lower()
    return text or None


def parse_launch_argv(argv: list[str]) -> dict[str, Any] | None:
    """What an `accelerate launch` command line asks: {"flag": the --mixed_precision
    value or None, "config_file": the --config_file value or None}; None when `argv` is
    not an accelerate launch. Options end at the training script."""
    start = None
    for i, arg in enumerate(argv[:4]):
        base = os.path.basename(arg)
        if base == "accelerate-launch" or arg == "accelerate.commands.launch":
            start = i + 1
        elif base == "accelerate" and argv[i + 1:i + 2] == ["launch"]:
            start = i + 2
        if start is not None:
            break
    if start is None:
        return None
    out: dict[str, Any] = {"flag": None, "config_file": None}
    names = {"--mixed_precision": "flag", "--mixed-precision": "flag",
             "--config_file": "config_file", "--config-file": "config_file"}
    i = start
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            if arg.endswith(".py") or i == start or not argv[i - 1].startswith("-"):
                break  # the training script
            i += 1
            continue
        key, eq, value = arg.partition("=")
        if key in names:
            if eq:
                out[names[key]] = value
            elif i + 1 < len(argv):
                out[names[key]] = argv[i + 1]
                i += 1
        i += 1
    out["flag"] = mode(out["flag"])
    return out


def config_precision(path: str) -> str | None:
    """The mixed_precision an accelerate config file sets (top-level key), or None:
    JSON by extension as accelerate decides, else YAML's flat `key: value` line. Reads at
    most 256 KiB and never raises."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            raw = fh.read(_MAX_CONFIG + 1)
        if len(raw) > _MAX_CONFIG:
            return None
        text = raw.decode("utf-8-sig")
        if path.endswith(".json"):
            data = json.loads(text)
            return mode(data.get("mixed_precision")) if isinstance(data, dict) else None
        m = _CONFIG_LINE.search(text)
        return mode(m.group(1)) if m else None
    except (OSError, ValueError, RecursionError):
        return None


def launch_sources(argv: list[str], env: Any = None) -> list[dict[str, Any]]:
    """The sources an `accelerate launch` command line brings: its flag and its config
    file (the one named, else accelerate's default), as {"source", "value", "where"}."""
    asked = parse_launch_argv(argv)
    if asked is None:
        return []
    out = []
    if asked["flag"]:
        out.append({"source": LAUNCH_FLAG, "value": asked["flag"], "where": None})
    path = asked["config_file"] or default_config_path(env)
    value = config_precision(path)
    if value:
        out.append({"source": CONFIG_FILE, "value": value, "where": path})
    return out


def launch_value(sources: list[dict[str, Any]]) -> str | None:
    """What `accelerate launch` sets ACCELERATE_MIXED_PRECISION to: its flag, else the
    config file's value, else "no"; None when the script was not started by it."""
    by = {s["source"]: s["value"] for s in sources}
    if LAUNCH_FLAG in by:
        return by[LAUNCH_FLAG]
    if CONFIG_FILE in by:
        return by[CONFIG_FILE]
    return None


def winner(sources: list[dict[str, Any]]) -> str | None:
    """The source whose value the Accelerator takes, by the precedence above."""
    kinds = [s["source"] for s in sources]
    for kind in (ACCELERATOR_ARG, TRAINER_ARGS, LAUNCH_FLAG, CONFIG_FILE, ENV):
        if kind in kinds:
            return kind
    return None


def runs_as(value: str | None, device: str | None) -> str | None:
    """What a requested mode computes in on a device type, where the device alone settles
    it (accelerate on a CPU: fp16 is ignored, fp8 has no path): "no" for fp32."""
    m = mode(value)
    if m is None:
        return None
    if device == "cpu":
        if m == "fp16":
            return "no"
        if m == "fp8":
            return "none"
    return m
