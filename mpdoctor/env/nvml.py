"""NVML (nvidia-ml-py): the driver's view of the GPUs.

This is what nvidia-smi reports: the driver version, the highest CUDA version the
driver supports, and per GPU the memory in use and by whom, MIG, persistence and
ECC. It sees GPUs even when torch cannot (a CPU-only torch, a driver too old for
the build), which is exactly when it matters. Every query is isolated: GeForce
cards answer NotSupported to several of them.

NVML is a C library in the driver: a broken or mismatched `libnvidia-ml.so.1` can
segfault or hang. So it is never loaded into mpdoctor: `start_nvml_child` runs this
file as a script in a child process (env/child.py: own process group, timeout) and
a crash becomes a fact, `{"status": "crashed", "error": {"message": "NVML crashed:
signal SIGSEGV"}}`. Standard library, pynvml and psutil only (it runs by path).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

TIMEOUT = 20.0


def _err(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _q(target: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
    try:
        target[key] = fn()
    except Exception as exc:
        name = type(exc).__name__
        if "NotSupported" in name or "NoPermission" in name:
            target[key] = None
        else:
            target.setdefault("errors", {})[key] = _err(exc)


def _processes(nv: Any, handle: Any, own_pids: set[int]) -> list[dict[str, Any]]:
    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nv, getter, None)
        if fn is None:
            continue
        try:
            listed = fn(handle)
        except Exception:
            continue
        for p in listed:
            used = getattr(p, "usedGpuMemory", None)
            entry: dict[str, Any] = {"pid": int(p.pid), "used_memory_bytes": int(used) if used else None,
                                     "kind": "compute" if "Compute" in getter else "graphics"}
            if int(p.pid) in own_pids:
                entry["mpdoctor"] = True  # our own torch child, not a competitor
            try:
                import psutil

                entry["name"] = psutil.Process(int(p.pid)).name()
            except Exception:  # another container's pid, or gone
                pass
            procs.append(entry)
    seen: set[tuple[int, str]] = set()
    unique = []
    for p in procs:
        key = (p["pid"], p["kind"])
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _gpu(nv: Any, i: int, own_pids: set[int]) -> dict[str, Any]:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    g: dict[str, Any] = {"index": i}
    _q(g, "name", lambda: _text(nv.nvmlDeviceGetName(h)))
    _q(g, "uuid", lambda: _text(nv.nvmlDeviceGetUUID(h)))
    _q(g, "pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId))
    _q(g, "capability", lambda: list(nv.nvmlDeviceGetCudaComputeCapability(h)))

    def memory() -> dict[str, int]:
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return {"total_bytes": int(m.total), "used_bytes": int(m.used), "free_bytes": int(m.free)}

    _q(g, "memory", memory)
    g["processes"] = _processes(nv, h, own_pids)
    _q(g, "mig_mode", lambda: {0: "disabled", 1: "enabled"}.get(nv.nvmlDeviceGetMigMode(h)[0], "unknown"))
    _q(g, "persistence_mode", lambda: bool(nv.nvmlDeviceGetPersistenceMode(h)))
    _q(g, "ecc_mode", lambda: bool(nv.nvmlDeviceGetEccMode(h)[0]))
    _q(g, "ecc_uncorrected_volatile", lambda: int(nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)))
    _q(g, "ecc_uncorrected_aggregate", lambda: int(nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)))
    return g


def collect_nvml(own_pids: set[int] | None = None) -> dict[str, Any]:
    """The `nvml` section. status: ok | unavailable (no NVIDIA driver / library) | error."""
    own_pids = own_pids or set()
    try:
        import pynvml as nv
    except Exception as exc:
        return {"status": "unavailable", "error": _err(exc)}
    try:
        nv.nvmlInit()
    except Exception as exc:
        return {"status": "unavailable", "error": _err(exc)}
    out: dict[str, Any] = {"status": "ok"}
    try:
        _q(out, "driver_version", lambda: _text(nv.nvmlSystemGetDriverVersion()))
        _q(out, "cuda_driver_version", lambda: int(nv.nvmlSystemGetCudaDriverVersion_v2()))
        _q(out, "nvml_version", lambda: _text(nv.nvmlSystemGetNVMLVersion()))
        count = nv.nvmlDeviceGetCount()
        gpus = []
        for i in range(count):
            try:
                gpus.append(_gpu(nv, i, own_pids))
            except Exception as exc:
                gpus.append({"index": i, "error": _err(exc)})
        out["gpus"] = gpus
    except Exception as exc:
        out["status"] = "error"
        out["error"] = _err(exc)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


def main(argv: list[str]) -> None:
    own = {int(a) for a in argv if a.isdigit()}
    fd = os.dup(1)
    os.dup2(2, 1)  # whatever the library prints cannot corrupt the answer
    try:
        result = collect_nvml(own)
    except BaseException as exc:
        result = {"status": "error", "error": _err(exc)}
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(result, default=str) + "\n")


class NvmlChild:
    """NVML examined in a child; `result()` is the snapshot's `nvml` section."""

    def __init__(self, own_pids: set[int], timeout: float = TIMEOUT) -> None:
        from . import child

        self.timeout = timeout
        self.handle = child.start(sys.executable, os.path.abspath(__file__), [str(p) for p in sorted(own_pids)],
                                  timeout)

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    def result(self) -> dict[str, Any]:
        o = self.handle.finish()
        if o.spawn_error:
            return {"status": "error", "error": o.spawn_error}
        if o.timed_out:
            return {"status": "timeout", "error": {"type": "Timeout",
                                                   "message": f"NVML did not answer within {self.timeout:g} s; killed"}}
        for line in reversed(o.stdout.decode("utf-8", "replace").splitlines()):
            try:
                data = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(data, dict) and isinstance(data.get("status"), str):
                return data
        out: dict[str, Any] = {"status": "crashed", "exit_status": o.returncode,
                               "error": {"type": "Crash", "message": o.death("NVML")}}
        tail = [ln[:300] for ln in o.stderr.decode("utf-8", "replace").splitlines()[-5:] if ln.strip()]
        if tail:
            out["stderr_tail"] = tail
        return out


def timeout_from_env(default: float = TIMEOUT) -> float:
    """MPDOCTOR_NVML_TIMEOUT in seconds (a hung driver costs at most this); a value that
    is not a positive finite number is ignored."""
    import math

    try:
        value = float(os.environ.get("MPDOCTOR_NVML_TIMEOUT", default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


def start_nvml_child(own_pids: set[int] | None = None, timeout: float | None = None) -> NvmlChild:
    return NvmlChild(set(own_pids or ()), timeout_from_env() if timeout is None else timeout)


if __name__ == "__main__":
    main(sys.argv[1:])
