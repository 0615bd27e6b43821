"""Examine torch in a child process and print what the snapshot needs as JSON.

Run by mpdoctor.env.torch_collector with a timeout, never imported by the parent:
a torch whose import raises, crashes the interpreter or hangs in the driver takes
only this process down. It does only what the rules need (no `import accelerate`,
no kernels beyond the one bf16 probe torch itself does), because it is on the
critical path of `mpdoctor check`.

Output: JSON objects on stdout, one a line (the real stdout is kept aside and fd 1
pointed at stderr first, so whatever torch or a CUDA library prints cannot corrupt it).
With `--environment` (the interpreter is another environment's, `--python`), first
`{"environment": {"platform": ..., "packages": ...}}` for that interpreter, written
before torch is imported so that it survives a torch that crashes; then the torch
object. Standard library only: mpdoctor need not be installed where this runs.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any, Callable

_MAX_MESSAGE = 4000


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:_MAX_MESSAGE]}


def _try(out: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """One fact; a failure is recorded under out["errors"][key] and the rest go on."""
    try:
        value = fn()
    except Exception as exc:
        out.setdefault("errors", {})[key] = _error(exc)
        return None
    out[key] = value
    return value


def _import_torch(out: dict[str, Any]) -> Any:
    t0 = time.perf_counter()
    try:
        import torch
    except BaseException as exc:  # ImportError, OSError from a .so, SystemExit from a broken build
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
            out["status"] = "not-installed"
            out["error"] = _error(exc)
            return None
        out["status"] = "import-error"
        out["error"] = _error(exc)
        tb = exc.__traceback__
        frames = []
        while tb is not None:
            frames.append(f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}")
            tb = tb.tb_next
        out["error"]["frames"] = frames[-6:]
        return None
    out["import_seconds"] = round(time.perf_counter() - t0, 3)
    return torch


def _device(torch: Any, i: int, emulation_arg: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"index": i}
    props = torch.cuda.get_device_properties(i)
    d["name"] = props.name
    d["capability"] = [props.major, props.minor]
    d["total_memory_bytes"] = int(props.total_memory)
    d["multi_processor_count"] = int(props.multi_processor_count)
    arch = getattr(props, "gcnArchName", None)
    if arch:
        d["gcn_arch"] = arch
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        d["uuid"] = str(uuid)
    with torch.cuda.device(i):
        _try(d, "bf16_supported", torch.cuda.is_bf16_supported)
        if emulation_arg:
            _try(d, "bf16_native", lambda: torch.cuda.is_bf16_supported(including_emulation=False))
    return d


def collect(in_process: bool = False) -> dict[str, Any]:
    """torch as the snapshot needs it. `in_process`: called inside a training process
    (torch already imported): GPU properties only where CUDA is already initialised,
    so that reading them creates no CUDA context the training did not ask for."""
    out: dict[str, Any] = {"status": "ok"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
            warnings.filterwarnings("ignore", category=quiet)
        torch = _import_torch(out)
        if torch is None:
            out["warnings"] = sorted({str(w.message)[:_MAX_MESSAGE] for w in caught})
            return out
        _try(out, "version", lambda: str(torch.__version__))
        _try(out, "path", lambda: os.path.dirname(torch.__file__))
        _try(out, "cuda_build", lambda: torch.version.cuda)
        _try(out, "hip_build", lambda: getattr(torch.version, "hip", None))
        _try(out, "debug_build", lambda: bool(torch.version.debug))
        # the CPU threads a training here gets (OMP_NUM_THREADS, cgroup limits)
        _try(out, "num_threads", torch.get_num_threads)
        _try(out, "num_interop_threads", torch.get_num_interop_threads)
        # The arch list is a compile-time constant: read it even when no GPU is usable
        # (get_arch_list() returns [] then, which would hide "no kernel image").
        _try(out, "arch_list", lambda: torch._C._cuda_getArchFlags().split() if hasattr(torch._C, "_cuda_getArchFlags") and torch._C._cuda_getArchFlags() else [])
        available = _try(out, "cuda_available", torch.cuda.is_available)
        count = _try(out, "device_count", torch.cuda.device_count) or 0
        if torch.backends.cudnn.is_available():
            _try(out, "cudnn", torch.backends.cudnn.version)
        else:
            out["cudnn"] = None
        if out.get("cuda_build") and available:
            _try(out, "nccl", lambda: ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
        import inspect

        try:
            emulation_arg = "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters
        except (TypeError, ValueError):
            emulation_arg = False
        out["bf16_has_including_emulation"] = emulation_arg
        devices = []
        if available and in_process and not torch.cuda.is_initialized():
            out["devices_unread"] = "CUDA was not initialised by the run"
            available = False
        if available:
            for i in range(count):
                try:
                    devices.append(_device(torch, i, emulation_arg))
                except Exception as exc:
                    devices.append({"index": i, "error": _error(exc)})
        out["devices"] = devices
        # Warnings from import and CUDA init are evidence ("driver too old",
        # "sm_37 is not compatible with the current PyTorch installation").
        out["warnings"] = sorted({str(w.message)[:_MAX_MESSAGE] for w in caught})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TF32 flags themselves warn in new torch
        tf32: dict[str, Any] = {}
        _try(tf32, "matmul_allow_tf32", lambda: bool(torch.backends.cuda.matmul.allow_tf32))
        _try(tf32, "cudnn_allow_tf32", lambda: bool(torch.backends.cudnn.allow_tf32))
        _try(tf32, "float32_matmul_precision", torch.get_float32_matmul_precision)
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            _try(tf32, "matmul_fp32_precision", lambda: str(torch.backends.cuda.matmul.fp32_precision))
        out["tf32"] = tf32

        mps: dict[str, Any] = {}
        _try(mps, "built", lambda: bool(torch.backends.mps.is_built()))
        _try(mps, "available", lambda: bool(torch.backends.mps.is_available()))
        if mps.get("available") and hasattr(torch.backends.mps, "is_macos_or_newer"):
            _try(mps, "macos_14_or_newer", lambda: bool(torch.backends.mps.is_macos_or_newer(14, 0)))
        out["mps"] = mps

        cpu: dict[str, Any] = {}
        _try(cpu, "capability", lambda: torch.backends.cpu.get_cpu_capability())
        for name in ("avx512_bf16", "amx_tile", "amx_fp16"):
            fn = getattr(torch.cpu, f"_is_{name}_supported", None)
            if fn is not None:
                _try(cpu, name, lambda fn=fn: bool(fn()))
        if hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported"):
            _try(cpu, "mkldnn_bf16", lambda: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
        out["cpu"] = cpu
    return out


def _sibling(name: str) -> Any:
    """A standard-library-only module of this folder, loaded by path (mpdoctor itself
    may not be importable in this interpreter)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(f"_mpdoctor_child_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def environment() -> dict[str, Any]:
    """This interpreter's platform and installed libraries (raw), for `--python`."""
    out: dict[str, Any] = {}
    for key, module, fn in (("platform", "host", "collect_platform"), ("packages", "packages", "installed")):
        try:
            out[key] = getattr(_sibling(module), fn)()
        except Exception as exc:
            out[key] = {"error": _error(exc)}
    return out


def main() -> None:
    import sys

    fd = os.dup(1)
    os.dup2(2, 1)  # torch's prints go to stderr; the JSON goes to the saved stdout
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        if "--environment" in sys.argv[1:]:
            try:
                env = environment()
            except BaseException as exc:
                env = {"error": _error(exc)}
            fh.write(json.dumps({"environment": env}, default=str) + "\n")
            fh.flush()
        try:
            result = collect()
        except BaseException as exc:  # never leave the parent without an answer
            result = {"status": "collector-error", "error": _error(exc)}
        fh.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
