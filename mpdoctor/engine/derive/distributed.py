"""Facts that need arithmetic: the loss-scaler timeline, byte counts, NCCL timeouts,
process exit statuses and the dtypes in a cuBLAS call.

Each deriver is pure and never raises: it returns what it can read and leaves the
rest out (a sentence whose fact is missing is then left out of the explanation).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ...knowledge.signals import signal_name
from ...knowledge.units import gib, parse_size
from . import deriver
from .fit import FIT_FACTS, OOM_SITE_FACTS, fit, oom_site

# --- numbers as messages print them ----------------------------------------------


def _number(text: Any) -> float | None:
    """'65536' / '65536.0' / '1.2e-05' / '201.' -> float; None when it is not one."""
    if text is None:
        return None
    try:
        value = float(str(text).strip().rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _scale_text(value: float) -> str:
    """A loss scale as people read it: '65536 (2^16)', '0.25 (2^-2)', '3000'."""
    if value <= 0:
        return f"{value:g}"
    exponent = math.log2(value)
    plain = f"{value:.0f}" if value >= 1 and value == int(value) else f"{value:.3g}"
    if abs(exponent - round(exponent)) < 1e-9:
        return f"{plain} (2^{round(exponent)})"
    return plain


# --- the dynamic loss scaler ------------------------------------------------------


@deriver("loss_scale", facts=("below_one", "first_scale", "halvings", "last_scale", "lowest_scale", "skips"))
def loss_scale(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """How the scale moved over the overflow lines, and how many steps were skipped.

    Every overflow line is one skipped optimizer step. Lines carry the scale that was
    tried (`attempted`) and/or the scale it was cut to (`new_scale`); a DeepSpeed
    hysteresis line skips a step without cutting the scale.
    """
    out: dict[str, Any] = {}
    # DeepSpeed names the rank in its line; count one rank's skips, not the sum.
    ranks = Counter(h.get("overflow_rank") for h in hits if h.get("overflow_rank") is not None)
    counted = hits
    if ranks:
        main_rank = ranks.most_common(1)[0][0]
        counted = [h for h in hits if h.get("overflow_rank") in (None, main_rank)]
    out["skips"] = len(counted)
    tried = [v for v in (_number(h.get("attempted")) for h in counted) if v is not None]
    cut_to = [v for v in (_number(h.get("new_scale")) for h in counted) if v is not None]
    first = tried[0] if tried else (cut_to[0] * 2 if cut_to else None)
    last = cut_to[-1] if cut_to else (tried[-1] if tried else None)
    if first is not None:
        out["first_scale"] = _scale_text(first)
    if last is not None:
        out["last_scale"] = _scale_text(last)
        lowest = min(cut_to + tried) if (cut_to or tried) else last
        out["lowest_scale"] = _scale_text(lowest)
        if lowest < 1:
            out["below_one"] = _scale_text(lowest)
    if first is not None and last is not None and first > 0 and last > 0 and first > last:
        out["halvings"] = round(math.log2(first / last))
    return out


# Where a dynamic scale has settled when training is healthy: a scale of 2^10 or more
# still protects fp16 gradients from underflow, so skips at that level are routine.
HEALTHY_SCALE = 2.0**10


@deriver("loss_scale_trend", facts=("first_scale", "halvings", "healthy_scale", "last_scale", "low_scale", "lowest_scale", "skips"))
def loss_scale_trend(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """loss_scale, plus a verdict: many skips while the scale stays high are routine
    (info); many skips that drove the scale low are a problem (the rule's severity)."""
    out = loss_scale(facts, hits)
    last = _number(str(out.get("last_scale", "")).split(" ")[0])
    if last is not None and last >= HEALTHY_SCALE:
        out["severity"] = "info"
        out["healthy_scale"] = out["last_scale"]
    elif last is not None:
        out["low_scale"] = out["last_scale"]
    return out


# --- byte counts ------------------------------------------------------------------


HUGE_HOST_REQUEST = 64 * 1024**3


@deriver("alloc_bytes", facts=("huge_request", "requested", "requested_bytes") + FIT_FACTS + OOM_SITE_FACTS)
def alloc_bytes(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """'you tried to allocate 132426121216 bytes' -> requested = '123.33 GiB'.

    Also reads sizes already printed with a unit ('3.2 GiB', '41.2 GB')."""
    out: dict[str, Any] = {}
    raw = facts.get("bytes")
    n: int | None = None
    if raw is not None:
        try:
            n = int(str(raw).replace(",", ""))
        except ValueError:
            n = None
    if n is None and facts.get("size"):
        # numpy prints '201. GiB' (a float with nothing after the point)
        n = parse_size(str(facts["size"]).replace(". ", " ").replace(".G", "G"))
    if n is not None:
        out["requested_bytes"] = n
        out["requested"] = gib(n)
        if n >= HUGE_HOST_REQUEST:
            # More than most machines have: usually a shape that went wrong.
            out["huge_request"] = gib(n)
    if len(hits) > 1:
        out["occurrences"] = len(hits)
    out.update(oom_site(facts))
    out.update(fit(facts))
    return out


# --- NCCL watchdog timeouts -------------------------------------------------------


def _duration(ms: float) -> str:
    seconds = ms / 1000
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


@deriver("nccl_timeout", facts=("desync", "silent_ranks", "timed_out_count", "timed_out_ranks", "timeout", "waited"))
def nccl_timeout(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """Timeout and wait in minutes, which ranks timed out, and whether they were
    waiting in different collectives (a desynchronised program, not a slow network)."""
    out: dict[str, Any] = {}
    timeout = _number(facts.get("timeout_ms"))
    ran = _number(facts.get("ran_ms"))
    if timeout is not None:
        out["timeout"] = _duration(timeout)
    if ran is not None:
        out["waited"] = _duration(ran)
    stuck = sorted({int(h["timed_out_rank"]) for h in hits if str(h.get("timed_out_rank", "")).isdigit()})
    if stuck:
        out["timed_out_ranks"] = ", ".join(str(r) for r in stuck)
        out["timed_out_count"] = len(stuck)
        world = _number(facts.get("world_size"))
        if world is not None and 0 < world <= 65536 and max(stuck) < world:
            missing = sorted(set(range(int(world))) - set(stuck))
            if missing and len(missing) <= 16:
                out["silent_ranks"] = ", ".join(str(r) for r in missing)
    seqs = sorted({int(h["seq"]) for h in hits if str(h.get("seq", "")).isdigit()})
    ops = sorted({str(h["op"]) for h in hits if h.get("op")})
    if len(seqs) > 1 or len(ops) > 1:
        parts = []
        if len(seqs) > 1:
            parts.append("SeqNum " + ", ".join(str(s) for s in seqs))
        if len(ops) > 1:
            parts.append("ops " + ", ".join(ops))
        out["desync"] = "; ".join(parts)
    return out


# --- process exit statuses --------------------------------------------------------

_MEANING = {
    "SIGKILL": "killed from outside, most often by the kernel's out-of-memory killer",
    "SIGABRT": "aborted, usually by a C++ exception or the NCCL watchdog tearing the process down",
    "SIGSEGV": "a segmentation fault in native code",
    "SIGBUS": "a bus error, typically /dev/shm (shared memory) running out",
    "SIGTERM": "asked to stop: the launcher or the scheduler terminated it",
    "SIGINT": "interrupted (Ctrl+C)",
}


@deriver("exit_status", facts=("exit_meaning", "signal", "signal_meaning") + FIT_FACTS)
def exit_status(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """exitcode -9 / return code 137 / '<Signals.SIGKILL: 9>' -> signal = SIGKILL."""
    out: dict[str, Any] = {}
    name = facts.get("signal_name")
    if name:
        name = str(name).upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
    code = facts.get("exitcode")
    number: int | None = None
    if name is None and code is not None:
        try:
            value = int(str(code))
        except ValueError:
            value = 0
        if value < 0:
            number = -value
        elif value > 128 and value < 160:
            number = value - 128
        if number:
            name = signal_name(number)
    if facts.get("signal_number") and name is None:
        try:
            name = signal_name(int(facts["signal_number"]))
        except ValueError:
            pass
    if name:
        out["signal"] = name
        if name in _MEANING:
            out["signal_meaning"] = _MEANING[name]
    if name and name in _MEANING:
        out["exit_meaning"] = f"the worker was killed by {name} ({_MEANING[name]})"
    elif name:
        out["exit_meaning"] = f"the worker was killed by {name}"
    elif code is not None and str(code).strip() == "1":
        out["exit_meaning"] = ("the worker raised a Python exception; its own traceback, printed by "
                               "that rank, is the error to read")
    elif code is not None and str(code).strip() not in ("0", ""):
        out["exit_meaning"] = "the worker called exit() with this status or died in native code"
    out.update(fit(facts))
    return out


# --- cuBLAS calls -----------------------------------------------------------------

_CUDA_TYPES = {
    "CUDA_R_16F": "float16",
    "CUDA_R_16BF": "bfloat16",
    "CUDA_R_32F": "float32",
    "CUDA_R_64F": "float64",
    "CUDA_R_8F_E4M3": "float8_e4m3fn",
    "CUDA_R_8F_E5M2": "float8_e5m2",
    "CUDA_R_8I": "int8",
    "CUDA_R_32I": "int32",
}
_GEMM_PREFIX = {"S": "float32", "D": "float64", "H": "float16", "C": "complex64", "Z": "complex128"}


@deriver("cublas_call", facts=("dtype", "half_precision"))
def cublas_call(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """The dtype a failing cuBLAS call worked in: `cublasGemmEx(... CUDA_R_16F ...)`
    -> float16, `cublasSgemm` -> float32."""
    out: dict[str, Any] = {}
    args = str(facts.get("call_args") or "")
    for token, dtype in _CUDA_TYPES.items():
        # CUDA_R_16F is a prefix of nothing else, but check whole tokens anyway.
        if f"{token}," in args or f"{token})" in args or args.endswith(token) or f"{token} " in args:
            out["dtype"] = dtype
            break
    fn = str(facts.get("function") or "")
    if "dtype" not in out and fn.startswith("cublas") and len(fn) > 6 and fn[6] in _GEMM_PREFIX:
        if fn[7:].lower().startswith("gemm"):
            out["dtype"] = _GEMM_PREFIX[fn[6]]
    if out.get("dtype") in ("float16", "bfloat16"):
        out["half_precision"] = out["dtype"]
    return out


# --- cuDNN's repro snippet ---------------------------------------------------------

_CUDNN_TYPES = {
    "CUDNN_DATA_HALF": "float16",
    "CUDNN_DATA_BFLOAT16": "bfloat16",
    "CUDNN_DATA_FLOAT": "float32",
    "CUDNN_DATA_DOUBLE": "float64",
    "torch.half": "float16",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float": "float32",
    "torch.float32": "float32",
}


@deriver("cudnn_snippet", facts=("dtype", "half_precision"))
def cudnn_snippet(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """The dtype of the convolution cuDNN failed on, from its repro dump."""
    out: dict[str, Any] = {}
    raw = facts.get("cudnn_dtype")
    if raw is not None and str(raw) in _CUDNN_TYPES:
        out["dtype"] = _CUDNN_TYPES[str(raw)]
        if out["dtype"] in ("float16", "bfloat16"):
            out["half_precision"] = out["dtype"]
    return out


# --- Apple MPS out-of-memory figures ------------------------------------------------


@deriver("mps_oom", facts=("headroom", "max_allowed_bytes", "mps_allocated_bytes", "other_allocations_bytes", "other_share", "requested_bytes") + OOM_SITE_FACTS)
def mps_oom(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """What the MPS limit left: max allowed - PyTorch's allocations - everything else."""
    out: dict[str, Any] = {}
    sizes = {k: parse_size(facts.get(k)) for k in ("requested", "mps_allocated", "other_allocations", "max_allowed")}
    for k, v in sizes.items():
        if v is not None:
            out[f"{k}_bytes"] = v
    alloc, other, limit = sizes["mps_allocated"], sizes["other_allocations"], sizes["max_allowed"]
    if alloc is not None and other is not None and limit is not None and limit > 0:
        out["headroom"] = gib(max(0, limit - alloc - other))
        if other > limit * 0.25:
            out["other_share"] = f"{100 * other / limit:.0f}%"
    out.update(oom_site(facts))
    return out


# --- where a deprecation warning was raised -------------------------------------------

_SITE = ("site-packages", "dist-packages")


@deriver("warning_origin", facts=("from_libraries", "from_your_code"))
def warning_origin(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """`/x/site-packages/kornia/feature/lightglue.py:44: FutureWarning: ...` -> the
    warning comes from the installed package `kornia`, not the user's code: nothing
    for the user to edit, so it is only info."""
    out: dict[str, Any] = {}
    libraries: list[str] = []
    own: list[str] = []
    for h in hits:
        path = str(h.get("warned_at") or "").replace("\\", "/")
        if not path:
            continue
        parts = path.split("/")
        site = next((i for i, p in enumerate(parts) if p in _SITE), None)
        if site is not None and site + 1 < len(parts):
            name = parts[site + 1]
            if name.endswith(".py"):
                name = name[:-3]
            if name not in libraries:
                libraries.append(name)
        elif path not in own:
            own.append(path)
    if libraries:
        out["from_libraries"] = ", ".join(libraries[:6])
    if own:
        out["from_your_code"] = ", ".join(own[:6])
    if libraries and not own:
        out["severity"] = "info"
    return out


# --- fallout of another rank's failure --------------------------------------------------


@deriver("peer_fallout")
def peer_fallout(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """A lost connection to a peer is the echo of that peer's failure: when another
    exception is in the log (the rule's context reads it into `other_error`), this
    finding is only a warning, so a non-GPU error elsewhere (a KeyError) is not turned
    into an error-severity communication finding."""
    if facts.get("other_error"):
        return {"severity": "warning"}
    return {}


# --- NCCL's socket errors -----------------------------------------------------------------

_REFUSED = ("refused",)
_PEER_GONE = ("reset by peer", "closed by remote peer", "connection abort", "broken pipe", "recv failed",
              "failed to execute operation connect")
_UNREACHABLE = ("timed out", "no route", "unreachable", "no socket interface")


@deriver("nccl_socket", facts=("_peer_gone", "_refused", "_unreachable", "peer_at"))
def nccl_socket(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """Which kind of socket failure an `NCCL WARN` line names (the errno's meaning decides
    the sentence), and the peer it was talking to."""
    out: dict[str, Any] = {}
    reasons = [str(h.get("socket_reason") or "").lower() for h in hits] or [str(facts.get("socket_reason") or "").lower()]
    first = reasons[0]
    if any(k in first for k in _REFUSED):
        out["_refused"] = "1"
    elif any(k in first for k in _UNREACHABLE):
        out["_unreachable"] = "1"
    elif any(k in first for k in _PEER_GONE):
        out["_peer_gone"] = "1"
    peer = facts.get("peer")
    if peer:
        out["peer_at"] = f" (to {peer})"
    else:
        out["peer_at"] = " between two ranks"
    return out
