"""How the run is configured: the accelerate config file and DeepSpeed's, the sources
of the precision and whether they agree, the number of processes against the GPUs, and
the environment variables CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge import compat
from ...knowledge.versions import satisfies
from ..plan import MODES, uses_deepspeed
from ..view import EnvView, parse_visible_devices
from ._common import need_torch, no_nvml


@check(facts=("outcome", "source", "under", "value", "meant"))
def mixed_precision_unknown(v: EnvView) -> Result:
    hits = []
    cfg = v.config or {}
    value = cfg.get("mixed_precision")
    if value is not None and value is not False and str(value).lower() not in MODES:
        hits.append(Hit({"value": str(value), "source": "the accelerate config file", "under": "accelerate launch",
                         "outcome": "refuses to start (Unknown mixed_precision mode)"},
                        [("accelerate_config.config.mixed_precision", value)]))
    env = v.env.get("ACCELERATE_MIXED_PRECISION")
    if env is not None and env.strip() not in MODES:
        facts = {"value": env, "source": "ACCELERATE_MIXED_PRECISION",
                 "under": "python train.py with Accelerator()",
                 "outcome": "accepts it without an error and trains in fp32 (measured with accelerate 1.16)"}
        if env.strip().lower() in MODES:  # 'BF16': right word, wrong case
            facts["meant"] = env.strip().lower()
        hits.append(Hit(facts, [("env.ACCELERATE_MIXED_PRECISION", env)]))
    return hits


def _no_config(v: EnvView) -> Skip:
    """Why a check of the config's settings cannot judge: no file, or one that cannot
    be read (that one is accelerate-config-unreadable's finding)."""
    if v.config_section.get("exists"):
        return Skip("the accelerate config cannot be read")
    return Skip("no accelerate config file")


@check(facts=("path", "value"))
def config_needs_launch(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return _no_config(v)
    mp = cfg.get("mixed_precision")
    if not isinstance(mp, str) or mp.lower() not in ("fp16", "bf16", "fp8"):
        return []
    if v.env.get("ACCELERATE_MIXED_PRECISION"):
        return []
    return [Hit({"value": mp.lower(), "path": v.config_section.get("path")},
                [("accelerate_config.config.mixed_precision", mp), ("env.ACCELERATE_MIXED_PRECISION", None)])]


@check(facts=("consequence", "ds_path", "first", "first_value", "second_value"))
def deepspeed_precision_conflict(v: EnvView) -> Result:
    if not v.plan or not uses_deepspeed(v):
        return []
    hits = []
    for d in v.plan.disagreements:
        if "DeepSpeed" in d.second and d.winner == "none":
            hits.append(Hit({"first": d.first, "first_value": d.first_value, "second_value": d.second_value,
                             "consequence": d.consequence, "ds_path": (v.config_section.get("deepspeed") or {}).get("path")},
                            [("accelerate_config.config.mixed_precision", (v.config or {}).get("mixed_precision")),
                             ("accelerate_config.deepspeed.config", f"fp16={((v.config_section.get('deepspeed') or {}).get('config') or {}).get('fp16')}, "
                              f"bf16={((v.config_section.get('deepspeed') or {}).get('config') or {}).get('bf16')}")]))
    return hits


@check(facts=("consequence", "first_value", "second_value"))
def deepspeed_overrides(v: EnvView) -> Result:
    if not v.plan or not uses_deepspeed(v):
        return []
    return [Hit({"first_value": d.first_value, "second_value": d.second_value, "consequence": d.consequence},
                [("accelerate_config.config.mixed_precision", (v.config or {}).get("mixed_precision", "no")),
                 ("accelerate_config.deepspeed.config", d.second_value)])
            for d in v.plan.disagreements if "DeepSpeed" in d.second and d.winner == "DeepSpeed config"]


@check(facts=("path", "problem"))
def deepspeed_config_missing(v: EnvView) -> Result:
    ds = v.config_section.get("deepspeed")
    if not ds:
        return []
    if not ds.get("exists"):
        return [Hit({"path": ds.get("path"), "problem": "does not exist"}, [("accelerate_config.deepspeed.path", ds.get("path"))])]
    if ds.get("error"):
        return [Hit({"path": ds.get("path"), "problem": f"cannot be read: {ds['error'].get('message')}"},
                    [("accelerate_config.deepspeed.error", ds["error"].get("message"))])]
    return []


@check(facts=("consequence", "first", "first_value", "second", "second_value"))
def precision_sources_disagree(v: EnvView) -> Result:
    if not v.plan:
        return []
    return [Hit({"first": d.first, "first_value": d.first_value, "second": d.second, "second_value": d.second_value,
                 "consequence": d.consequence},
                [(s.path, s.value) for s in v.plan.sources if s.source.startswith((d.first, d.second))])
            for d in v.plan.disagreements
            if "DeepSpeed" not in d.second and d.first != "--mixed-precision"]


def _distributed(cfg: dict[str, Any]) -> str:
    return str(cfg.get("distributed_type", "NO")).upper()


def _machines(cfg: dict[str, Any]) -> int:
    """num_machines as accelerate reads it; a value that is not a number counts as 1
    (accelerate itself would refuse to start: not this check's business)."""
    try:
        return max(int(cfg.get("num_machines") or 1), 1)
    except (TypeError, ValueError, OverflowError):
        return 1


@check(facts=("cvd", "distributed_type", "machines", "num_processes", "visible"))
def num_processes_exceeds_gpus(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return _no_config(v)
    dist = _distributed(cfg)
    if dist not in ("MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM") or v.use_cpu:
        return []
    n = cfg.get("num_processes")
    machines = _machines(cfg)
    visible = v.visible_gpu_count
    if visible is None:
        return Skip("the number of visible GPUs is not known (no torch and no NVML)")
    try:
        per_machine = int(n) // max(machines, 1)
    except (TypeError, ValueError, OverflowError):
        return []
    if per_machine <= visible:
        return []
    return [Hit({"num_processes": n, "machines": machines, "visible": visible, "distributed_type": dist,
                 "cvd": v.env.get("CUDA_VISIBLE_DEVICES")},
                [("accelerate_config.config.num_processes", n),
                 ("torch.device_count" if v.cuda_available else "nvml.gpus", visible)])]


@check(facts=("distributed_type", "num_processes", "why_cpu"))
def multi_gpu_without_cuda(v: EnvView) -> Result:
    """A config that starts several GPU processes on a machine where torch has no CUDA
    device: accelerate falls back to one CPU process each, and they never join (what a
    run shows as processes-did-not-join), judged here from the config and the machine."""
    cfg = v.config
    if cfg is None:
        return _no_config(v)
    dist = _distributed(cfg)
    if dist != "MULTI_GPU" or v.use_cpu:
        return []
    if (no_torch := need_torch(v)):
        return no_torch
    try:
        per_machine = int(cfg.get("num_processes") or 1) // _machines(cfg)
    except (TypeError, ValueError, OverflowError):
        return []
    if per_machine <= 1 or v.device != "cpu":
        return []
    if not v.cuda_build and not v.hip_build:
        why = "cpu_only_build"
        ev = ("torch.cuda_build", None)
    else:
        why = "cuda_unavailable"
        ev = ("torch.cuda_available", False)
    return [Hit({"distributed_type": dist, "num_processes": cfg.get("num_processes"), "why_cpu": why},
                [("accelerate_config.config.distributed_type", dist),
                 ("accelerate_config.config.num_processes", cfg.get("num_processes")), ev])]


@check(facts=("num_processes", "visible"))
def multi_gpu_one_gpu(v: EnvView) -> Result:
    cfg = v.config
    if cfg is None:
        return _no_config(v)
    if _distributed(cfg) != "MULTI_GPU" or _machines(cfg) > 1:
        return []
    visible = v.visible_gpu_count
    if visible is None:
        return Skip("the number of visible GPUs is not known")
    if visible != 1:
        return []
    return [Hit({"visible": visible, "num_processes": cfg.get("num_processes")},
                [("accelerate_config.config.distributed_type", "MULTI_GPU"),
                 ("torch.device_count" if v.cuda_available else "nvml.gpus", visible)])]


@check(facts=("count", "invalid", "shown", "value"))
def cuda_visible_devices_invalid(v: EnvView) -> Result:
    value = v.env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    if (s := no_nvml(v)):
        return s
    shown, invalid = parse_visible_devices(value, v.nvml_gpus)
    if invalid:
        return [Hit({"value": value, "invalid": ", ".join(invalid), "count": len(v.nvml_gpus),
                     "shown": ", ".join(map(str, shown or [])) or "none"},
                    [("env.CUDA_VISIBLE_DEVICES", value), ("nvml.gpus", f"{len(v.nvml_gpus)} GPU(s)")])]
    if shown == [] and v.nvml_gpus:
        return [Hit({"value": value, "invalid": None, "count": len(v.nvml_gpus), "shown": "none"},
                    [("env.CUDA_VISIBLE_DEVICES", value), ("nvml.gpus", f"{len(v.nvml_gpus)} GPU(s)")])]
    return []


def _alloc_problems(value: str, torch_version: str | None) -> tuple[list[str], list[str]]:
    conf = compat.alloc_conf()
    malformed, unknown = [], []
    for part in [p for p in value.split(",") if p.strip()]:
        if ":" not in part:
            malformed.append(f"'{part.strip()}' is not key:value")
            continue
        key, _, val = (x.strip() for x in part.partition(":"))
        if key not in conf["keys"]:
            import difflib

            close = difflib.get_close_matches(key, conf["keys"], n=1)
            unknown.append(f"'{key}'" + (f" (did you mean {close[0]}?)" if close else ""))
            continue
        if key in conf["booleans"] and val not in ("True", "False"):
            malformed.append(f"{key}:{val} must be True or False (capitalised)")
        elif key == "backend" and val not in conf["backends"]:
            malformed.append(f"backend:{val} is not one of {', '.join(conf['backends'])}")
        elif key == "garbage_collection_threshold":
            try:
                ok = 0.0 < float(val) < 1.0
            except ValueError:
                ok = False
            if not ok:
                malformed.append(f"garbage_collection_threshold:{val} must be between 0 and 1")
        elif key in ("max_split_size_mb", "roundup_power2_divisions", "pinned_num_register_threads") and not val.isdigit():
            malformed.append(f"{key}:{val} must be a whole number")
        since = conf.get("since", {}).get(key)
        if since and torch_version and satisfies(torch_version, f">={since}") is False:
            malformed.append(f"{key} needs torch >= {since} (this is {torch_version})")
    return malformed, unknown


def _alloc_conf_hits(v: EnvView, which: int, key: str) -> Result:
    """One hit per allocator variable whose value has problems of kind `which`
    (0: malformed, 1: unknown keys, as _alloc_problems returns them)."""
    hits = []
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = v.env.get(name)
        if value:
            problems = _alloc_problems(value, v.torch_version)[which]
            if problems:
                joiner = "; " if which == 0 else ", "
                hits.append(Hit({"variable": name, "value": value, key: joiner.join(problems)},
                                [(f"env.{name}", value)]))
    return hits


@check(facts=("problems", "value", "variable"))
def alloc_conf_malformed(v: EnvView) -> Result:
    return _alloc_conf_hits(v, 0, "problems")


@check(facts=("keys", "value", "variable"))
def alloc_conf_unknown_key(v: EnvView) -> Result:
    return _alloc_conf_hits(v, 1, "keys")


@check(facts=("path", "problem"))
def accelerate_config_unreadable(v: EnvView) -> Result:
    sec = v.config_section
    if not sec.get("exists"):
        return []
    err = sec.get("error")
    if not err:
        return []
    return [Hit({"path": sec.get("path"), "problem": err.get("message")}, [("accelerate_config.error", err.get("message"))])]
