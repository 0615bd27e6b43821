"""The effective precision plan: every source that can set the precision, which one
wins (under `accelerate launch` and under a plain `python train.py`), where two
disagree, and what will actually run on this hardware. Plus the fp8 matrix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..knowledge import compat
from ..knowledge.versions import satisfies

MODES = ("no", "fp16", "bf16", "fp8")
_DS_TRUE = ("true", "1", "yes")


def normalise_mode(value: Any) -> str | None:
    """A config file's precision value as `accelerate launch` uses it: lower-cased
    (launch does `PrecisionType(value.lower())`); YAML's unquoted `no` is False."""
    if value is None:
        return None
    if value is False:
        return "no"
    return str(value).strip().lower()


def env_mode(value: Any) -> str | None:
    """ACCELERATE_MIXED_PRECISION as `Accelerator()` reads it: as written. accelerate
    compares it case-sensitively (accelerate 1.16: 'BF16' is kept, and no autocast runs)."""
    if value is None:
        return None
    return str(value).strip() or None


@dataclass
class Source:
    source: str       # "accelerate config file", "ACCELERATE_MIXED_PRECISION", ...
    value: str
    path: str         # snapshot field
    applies: str      # when it is read: "accelerate launch", "python train.py", "always"


@dataclass
class Disagreement:
    first: str
    first_value: str
    second: str
    second_value: str
    winner: str
    consequence: str


@dataclass
class PrecisionPlan:
    requested: str | None
    requested_from: str | None
    under_launch: str | None
    under_python: str | None
    sources: list[Source] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    deepspeed: str | None = None   # what the DeepSpeed JSON decides: fp16/bf16/no/auto/both
    fsdp: bool = False
    effective: str | None = None
    effective_reason: str = ""
    # what each way of starting the script really trains in on this machine (what_runs)
    launch_runs_as: str | None = None
    python_runs_as: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _flag(value: Any) -> str:
    return str(value).strip().lower()


def deepspeed_mode(ds: dict[str, Any]) -> str | None:
    """fp16 / bf16 / auto / no / both from a DeepSpeed JSON's fp16 and bf16 blocks."""
    def enabled(block: Any) -> str | None:
        if not isinstance(block, dict) or "enabled" not in block:
            return None
        v = _flag(block["enabled"])
        return "auto" if v == "auto" else ("on" if v in _DS_TRUE else "off")

    fp16 = enabled(ds.get("fp16"))
    bf16 = enabled(ds.get("bf16") if "bf16" in ds else ds.get("bfloat16"))
    if fp16 == "on" and bf16 == "on":
        return "both"
    if fp16 == "on":
        return "fp16"
    if bf16 == "on":
        return "bf16"
    if "auto" in (fp16, bf16):
        return "auto"
    if fp16 == "off" or bf16 == "off":
        return "no"
    return None


def uses_deepspeed(view: Any) -> bool:
    cfg = view.config or {}
    return (str(cfg.get("distributed_type", "")).upper() == "DEEPSPEED"
            or _flag(view.env.get("ACCELERATE_USE_DEEPSPEED", "")) in _DS_TRUE)


def uses_fsdp(view: Any) -> bool:
    cfg = view.config or {}
    return (str(cfg.get("distributed_type", "")).upper() == "FSDP"
            or _flag(view.env.get("ACCELERATE_USE_FSDP", "")) in _DS_TRUE)


def build_plan(view: Any, argument: str | None = None, argument_from: str = "--mixed-precision") -> PrecisionPlan:
    """`argument`: the precision asked for directly (check's --mixed-precision, or the
    Accelerator a run recorded; `argument_from` names which)."""
    cfg = view.config
    sources: list[Source] = []
    if argument:
        sources.append(Source(argument_from, argument, "argument",
                              "this check" if argument_from == "--mixed-precision" else "this run"))
    cfg_mp = None
    if cfg is not None and "mixed_precision" in cfg and cfg["mixed_precision"] is not None:
        cfg_mp = normalise_mode(cfg["mixed_precision"])
        sources.append(Source(f"accelerate config file ({view.config_section.get('path')})", cfg_mp,
                              "accelerate_config.config.mixed_precision", "accelerate launch"))
    env_mp = env_mode(view.env.get("ACCELERATE_MIXED_PRECISION"))
    if env_mp:
        sources.append(Source("ACCELERATE_MIXED_PRECISION", env_mp, "env.ACCELERATE_MIXED_PRECISION",
                              "python train.py (accelerate launch overwrites it)"))
    ds_mode = None
    ds_section = view.config_section.get("deepspeed") or {}
    if uses_deepspeed(view) and isinstance(ds_section.get("config"), dict):
        ds_mode = deepspeed_mode(ds_section["config"])
        if ds_mode:
            sources.append(Source(f"DeepSpeed config ({ds_section.get('path')})", ds_mode,
                                  "accelerate_config.deepspeed.config", "with DeepSpeed"))
    fsdp = uses_fsdp(view)
    if fsdp and cfg is not None:
        fsdp_config = cfg.get("fsdp_config")
        for key, value in (fsdp_config.items() if isinstance(fsdp_config, dict) else ()):
            if "mixed_precision" in key and value not in (None, ""):
                sources.append(Source(f"FSDP setting {key}", normalise_mode(value) or "",
                                      f"accelerate_config.config.fsdp_config.{key}", "with FSDP"))

    under_launch = argument or cfg_mp or ("no" if cfg is not None else None)
    under_python = env_mp or "no"
    if argument:
        requested, requested_from = argument, argument_from
    elif cfg_mp:
        requested, requested_from = cfg_mp, "accelerate config file"
    elif env_mp:
        requested, requested_from = env_mp, "ACCELERATE_MIXED_PRECISION"
    else:
        requested, requested_from = None, None

    disagreements: list[Disagreement] = []
    if cfg_mp and env_mp and cfg_mp != env_mp:
        disagreements.append(Disagreement(
            "accelerate config file", cfg_mp, "ACCELERATE_MIXED_PRECISION", env_mp,
            winner="depends on how you start the script",
            consequence=f"`accelerate launch` uses the config's {cfg_mp} (it overwrites the variable); "
                        f"`python train.py` uses the variable's {env_mp}"))
    if argument and cfg_mp and argument != cfg_mp:
        disagreements.append(Disagreement(
            argument_from, argument, "accelerate config file", cfg_mp,
            winner="--mixed-precision (for this check only)",
            consequence=f"this check judges {argument}; `accelerate launch` with this config will train in {cfg_mp}"))
    if ds_mode in ("fp16", "bf16", "both"):
        base = requested or "no"
        if ds_mode == "both":
            disagreements.append(Disagreement(
                "DeepSpeed fp16.enabled", "true", "DeepSpeed bf16.enabled", "true", winner="none",
                consequence="DeepSpeed refuses the config: bfloat16 and fp16 modes cannot be simultaneously enabled"))
        elif base in ("fp16", "bf16") and base != ds_mode:
            disagreements.append(Disagreement(
                "mixed_precision", base, "DeepSpeed config", ds_mode, winner="none",
                consequence=f"accelerate raises: `--mixed_precision` arg cannot be set to `{base}` when "
                            f"`{ds_mode}` is set in the DeepSpeed config file"))
        elif base in ("no",) and ds_mode in ("fp16", "bf16"):
            disagreements.append(Disagreement(
                "mixed_precision", base, "DeepSpeed config", ds_mode, winner="DeepSpeed config",
                consequence=f"with DeepSpeed the JSON decides: training runs in {ds_mode}"))
            requested, requested_from = ds_mode, "DeepSpeed config"
    for s in sources:
        if s.source.startswith("FSDP setting") and requested and s.value not in (requested, "fp32", "no") \
                and s.value in MODES:
            disagreements.append(Disagreement(
                "mixed_precision", requested, s.source, s.value, winner=s.source,
                consequence=f"FSDP's own policy casts parameters to {s.value}, while autocast runs {requested}"))

    plan = PrecisionPlan(requested, requested_from, under_launch, under_python, sources, disagreements,
                         deepspeed=ds_mode, fsdp=fsdp)
    plan.effective, plan.effective_reason = what_runs(requested, view) if requested else (None, "")
    refused = next((d for d in disagreements if d.winner == "none"), None)
    if refused:
        plan.effective, plan.effective_reason = None, refused.consequence
    plan.launch_runs_as = _runs_as(under_launch, view)
    plan.python_runs_as = _runs_as(under_python, view)
    return plan


def _runs_as(mode: str | None, view: Any) -> str | None:
    """What `mode` trains in here, as the plan line says it: fp32 for no mixed precision,
    "cannot run" where the mode does not run at all, the mode itself where the device is
    not known."""
    if mode in (None, "no"):
        return "fp32"
    ran, _ = what_runs(mode, view)
    if ran is None and (view.torch_ok or view.use_cpu):
        return "cannot run"
    return ran or mode


def runs_here(mode: str, view: Any) -> bool | None:
    """Whether `mode` trains in that precision on this machine (fp16 on a CPU: no, it is
    fp32; fp8 without fp8 hardware: no). None where the device cannot be judged."""
    if not view.torch_ok and not view.use_cpu:
        return None
    ran, _ = what_runs(mode, view)
    return ran is not None and ran.split(" ")[0] == mode


def advisable_mode(view: Any) -> str | None:
    """The 16-bit mode to advise on this machine, the one every face names: bf16 where it
    runs natively (Ampere and newer, a CPU, MPS on macOS 14+, ROCm), else fp16 where it
    runs, else none (None: nothing runs, or the device is not known)."""
    gpus = view.cuda_gpus
    low = min((g.cc for g in gpus if g.cc), default=None) if view.device == "cuda" and not view.rocm else None
    order = ("fp16", "bf16") if low is not None and low < (8, 0) else ("bf16", "fp16")
    for mode in order:
        if runs_here(mode, view):
            ran, _ = what_runs(mode, view)
            if ran == mode:
                return mode
    return None


def what_runs(mode: str | None, view: Any) -> tuple[str | None, str]:
    """What training in `mode` really does on this machine, and why."""
    if mode is None:
        return None, ""
    device = view.device
    acc, tv = view.accelerate, view.torch_version
    if mode not in MODES:
        return "fp32", (f"accelerate launch refuses {mode!r} (Unknown mixed_precision mode); "
                        f"a plain Accelerator() accepts it silently and trains in fp32")
    if not view.torch_ok and not view.use_cpu:  # use_cpu: the device is known without torch
        return None, "torch cannot be examined here"
    if mode == "no":
        return "fp32", "no mixed precision"
    if device == "cpu":
        if mode == "fp16":
            return "fp32", "accelerate ignores fp16 on a CPU: no autocast, no GradScaler"
        if mode == "bf16":
            return "bf16", "CPU autocast in bf16"
        return None, "fp8 needs an NVIDIA GPU of compute capability 8.9+ (or an AMD MI300)"
    if device == "mps":
        row = compat.accelerate_device_outcome(mode, "mps", acc, tv)
        if row and row["outcome"] == "refused":
            return None, row["detail"]
        if mode == "fp8":
            return None, "fp8 is not available on MPS"
        return mode, "MPS autocast"
    gpus = view.cuda_gpus
    if view.rocm:
        if mode == "fp8":
            targets = [compat.rocm_target(g.gcn_arch) for g in view.gpus]
            if targets and all(t and t.get("fp8") for t in targets):
                return "fp8", "ROCm fp8 (" + (targets[0].get("fp8_format") or "") + ")"
            return None, "fp8 on ROCm needs an MI300 (gfx942) or MI350 (gfx950)"
        return mode, "ROCm"
    if not gpus:
        return mode, ""
    low = min((g.cc for g in gpus if g.cc), default=None)
    if mode == "bf16" and low and low < (8, 0):
        if view.torch_at_least("2.3"):
            return "bf16 (emulated)", f"compute capability {low[0]}.{low[1]} has no bf16 hardware; torch emulates it"
        return None, "accelerate refuses bf16 below compute capability 8.0 with this torch"
    if mode == "fp8":
        if low and low < (8, 9):
            return "fp16", (f"compute capability {low[0]}.{low[1]} < 8.9: accelerate logs a warning "
                            f"and trains in fp16 instead")
        if not any(r["usable"] for r in fp8_matrix(view)):
            return None, "no usable fp8 backend (TransformerEngine, torchao, MS-AMP)"
    return mode, ""


def fp8_matrix(view: Any) -> list[dict[str, Any]]:
    """One row per fp8 backend: installed version, and each requirement with its verdict."""
    gpus = [g for g in view.gpus if g.vendor == "nvidia"]
    low = min((g.cc for g in gpus if g.cc), default=None)
    acc = view.accelerate
    cuda = view.cuda_build
    rows = []
    for be in compat.fp8_backends():
        installed = next((view.pkg(p) for p in be["packages"] if view.pkg(p)), None)
        checks: list[dict[str, Any]] = []

        def check(what: str, ok: bool | None, reason: str) -> None:
            checks.append({"requirement": what, "ok": ok, "reason": reason})

        check("installed", bool(installed), f"{be['packages'][0]} {installed}" if installed
              else f"{be['packages'][0]} is not installed")
        if be.get("package_min") and installed:
            ok = satisfies(installed, f">={be['package_min']}")
            check(f"{be['packages'][0]} >= {be['package_min']}", ok,
                  f"{installed} {'meets' if ok else 'is older than'} accelerate's minimum {be['package_min']}")
        need = compat.parse_cc(be["cc_min"])
        if view.rocm:
            targets = [compat.rocm_target(g.gcn_arch) for g in view.gpus]
            ok = bool(targets) and all(t and t.get("fp8") for t in targets)
            check("GPU with fp8", ok, "ROCm: fp8 needs gfx942 (MI300) or gfx950 (MI350)"
                  + ("" if ok else f"; found {', '.join(sorted({(g.gcn_arch or '?').split(':')[0] for g in view.gpus}))}"))
        elif low is None:
            check(f"compute capability >= {be['cc_min']}", None, "no NVIDIA GPU visible: cannot be judged here")
        else:
            ok = low >= need
            check(f"compute capability >= {be['cc_min']}", ok,
                  f"lowest GPU is {low[0]}.{low[1]}" + ("" if ok else f" < {be['cc_min']}"))
            if ok and be.get("ada_cuda_min") and low < (9, 0):
                cok = satisfies(cuda, f">={be['ada_cuda_min']}") if cuda else None
                check(f"CUDA >= {be['ada_cuda_min']} on Ada", cok, f"torch is built with CUDA {cuda}")
        if acc:
            lo, hi = be.get("accelerate_min"), be.get("accelerate_max")
            ok = satisfies(acc, f">={lo}" + (f",<{hi}" if hi else ""))
            span = f">= {lo}" + (f" and < {hi}" if hi else "")
            check(f"accelerate {span}", ok, f"accelerate {acc}" + ("" if ok else
                  (f" no longer supports {be['name']}" if hi and satisfies(acc, f'>={hi}') else " is too old")))
        else:
            check("accelerate installed", None, "accelerate is not installed: its fp8 support cannot be judged")
        usable = all(c["ok"] is not False for c in checks) and bool(installed) and all(
            c["ok"] for c in checks if c["requirement"].startswith(("compute", "GPU")))
        failing = [c["reason"] for c in checks if c["ok"] is False]
        rows.append({"backend": be["name"], "installed": installed, "usable": usable,
                     "checks": checks, "verdict": "usable" if usable else
                     ("; ".join(failing) if failing else "cannot be judged here")})
    return rows
