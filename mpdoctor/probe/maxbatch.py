"""--max-batch (child side): the largest batch that trains one full step (forward,
backward, optimizer step) in this mode without running out of memory.

A bounded search, as accelerate's `find_executable_batch_size` does it but upwards:
double from the probe's batch size until a step fails or the upper bound is reached,
then bisect between the last size that trained and the first that did not, until the
gap is at most `resolution(lo)` (1 below 64, then about 3%). The out-of-memory error is
caught here, in the child; everything the failed try held is released (gc, the CUDA
cache) before the next. On the CPU an allocation failure needs a bound: for the search
the child's address space is capped (RLIMIT_AS) at --memory-limit, or else at what it
has mapped plus 90% of what the machine has free, so the search meets a MemoryError and
not the kernel's OOM killer. The mode's own measurements run before the cap.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

from ..redact import clip

_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate",
              "not enough memory", "std::bad_alloc")


# Under an address-space cap oneDNN reports its failed allocation so.
_CAPPED_OOM_WORDS = ("could not create a primitive",)


def is_oom(exc: BaseException, capped: bool = False) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "OutOfMemory"):
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(w in text for w in _OOM_WORDS + (_CAPPED_OOM_WORDS if capped else ()))
    return False


def resolution(lo: int) -> int:
    return max(1, lo // 32)


def vm_size() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def cap_address_space(limit: int) -> bool:
    """RLIMIT_AS at `limit` bytes (never above a hard limit already set)."""
    try:
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        return True
    except (ImportError, ValueError, OSError):
        return False


def free_memory(torch: Any, device: Any) -> None:
    if torch is None:  # a search over a plain function (the tests): nothing to free
        return
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def search(try_step: Callable[[int], None], start: int, upper: int, torch: Any, device: Any,
           deadline: float | None = None, capped: bool = False) -> dict[str, Any]:
    """`try_step(n)` trains one step at batch n (raising the OOM if it does not fit)."""
    tries: list[dict[str, Any]] = []
    cache: dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n in cache:
            return cache[n]
        t0 = time.perf_counter()
        ok, error = True, None
        try:
            try_step(n)
        except BaseException as exc:  # noqa: BLE001 - anything else is re-raised below
            if not is_oom(exc, capped):
                raise
            ok, error = False, f"{type(exc).__name__}: {clip(str(exc).splitlines()[0], 160) if str(exc) else ''}"
            exc = None  # drop the traceback's frames (and the tensors they hold) now
        free_memory(torch, device)
        tries.append({"batch": n, "ok": ok, "s": round(time.perf_counter() - t0, 3),
                      **({"error": error} if error else {})})
        cache[n] = ok
        return ok

    start = max(1, min(start, upper))
    out: dict[str, Any] = {"upper_bound": upper, "tries": tries}
    if not fits(start):
        # below the probe's own batch: halve down, as find_executable_batch_size does
        hi = start
        lo = start // 2
        while lo >= 1 and not fits(lo):
            hi, lo = lo, lo // 2
        if lo < 1:
            out.update(batch=0, resolution=1, bounded=False)
            return out
    else:
        lo, hi = start, None
        while hi is None:
            if lo >= upper:
                out.update(batch=lo, resolution=0, bounded=True)
                return out
            if deadline is not None and time.monotonic() > deadline:
                out.update(batch=lo, resolution=None, bounded=False, stopped="time")
                return out
            n = min(upper, lo * 2)
            if fits(n):
                lo = n
            else:
                hi = n
    while hi - lo > resolution(lo):
        if deadline is not None and time.monotonic() > deadline:
            out.update(stopped="time")
            break
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    out.update(batch=lo, first_failed=hi, resolution=hi - lo, bounded=False)
    return out


def default_cap() -> int | None:
    """Without --memory-limit on the CPU: what is mapped now plus 90% of what the
    machine has available, so a failed try is a MemoryError, not the OOM killer."""
    vm, avail = vm_size(), mem_available()
    if vm is None or avail is None:
        return None
    return vm + int(avail * 0.9)
