"""One precision mode, trained for real in its own process: `python -m mpdoctor.probe.child SPEC`.

The parent never imports torch; this process does, trains the model (a built-in one,
or the user's --model SPEC through usermodel.py) through
`accelerate.Accelerator(mixed_precision=MODE)` and writes what it measured to the
result file named in the spec. Progress goes to stdout as `@@probe {json}` lines.
A failure is not caught: the genuine traceback on stderr is what the parent explains
with the rule base, exactly as `mpdoctor explain` would.

MPDOCTOR_PROBE_FAULT=MODE:KIND[+KIND][,MODE:KIND] makes the child of MODE fail for real,
for the tests, for recording fixtures/probe/ and for trying the report out: `oom` (a real
allocation far beyond memory, at the second step), `dtype` (the model cast to half and
fed float), `nan` (a NaN written into the first Linear's weight at the third step, as
a bad update would), `nowatch` (the probe's minimal observer instead of mpdoctor.watch), `torch-fp16`
(the fp16 mode run with torch's own CPU float16 autocast and a GradScaler, as it runs on
a GPU, where accelerate would train fp32), and, before torch is even imported, `hang`
(never finishes, with a sleeping grandchild in its process group) and `abort` (dies by
SIGABRT, no traceback).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from ..knowledge.dtypes import dtype_name
from .events import emit


def _fault(mode: str) -> set[str]:
    kinds: set[str] = set()
    for item in os.environ.get("MPDOCTOR_PROBE_FAULT", "").split(","):
        m, _, kind = item.partition(":")
        if m.strip() == mode and kind.strip():
            kinds.update(k.strip() for k in kind.split("+") if k.strip())
    return kinds


# -- memory: device memory on accelerators, the training loop's RSS growth on the CPU --

def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the baseline may include cached free memory


class MemoryMeter:
    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self.kind = "unknown"
        self.base = 0

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats(self.device)
            self.kind = "cuda.max_memory_allocated"
            return
        if self.device.type == "mps":
            self.kind = "mps.current_allocated_memory"
            return
        # Give freed heap back first (glibc), so the baseline is live memory only and
        # the growth does not depend on what earlier phases happened to leave cached.
        _malloc_trim()
        # Linux: writing 5 to clear_refs resets VmHWM to the current RSS, so the peak
        # read afterwards is the training loop's own (not torch's import).
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.base = (_status_kb("VmRSS") or 0) * 1024
            self.kind = "rss_peak_growth"
        except OSError:
            import resource

            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.kind = "ru_maxrss_growth"

    def peak(self) -> int | None:
        if self.kind.startswith("cuda"):
            return int(self.torch.cuda.max_memory_allocated(self.device))
        if self.kind.startswith("mps"):  # MPS keeps no peak: the level after the loop
            return int(self.torch.mps.current_allocated_memory())
        if self.kind == "rss_peak_growth":
            hwm = _status_kb("VmHWM")
            return None if hwm is None else max(0, hwm * 1024 - self.base)
        if self.kind == "ru_maxrss_growth":
            import resource

            return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)
        return None


class CpuContention:
    """How much of the machine other processes used while this mode was timed:
    /proc/stat's busy time minus our own, over the wall time of all CPUs, summed over
    the mode's own timed rounds only (between them the other modes' children run, and
    they are not "others"). On a shared 2-core box a neighbour's job can halve a mode's
    speed; the report says so."""

    def __init__(self) -> None:
        self.busy = self.ours = self.wall = 0.0
        self._start: tuple[float, float, float] | None = None
        self.ok = True

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
            ticks = [int(x) for x in fields]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        t = os.times()
        return (sum(ticks) - idle) / hz, t.user + t.system, time.monotonic()

    def begin(self) -> None:
        self._start = self._read()
        self.ok = self.ok and self._start is not None

    def end(self) -> None:
        end = self._read()
        if self._start is None or end is None:
            self.ok = False
            return
        busy, ours, wall = (e - s for e, s in zip(end, self._start))
        self.busy, self.ours, self.wall = self.busy + busy, self.ours + ours, self.wall + wall
        self._start = None

    def others_share(self) -> float | None:
        cpus = os.cpu_count() or 1
        if not self.ok or self.wall <= 0:
            return None
        return max(0.0, min(1.0, (self.busy - self.ours) / (self.wall * cpus)))


def _device_facts(torch: Any, device: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"type": device.type, "torch": torch.__version__}
    try:  # a busy machine times its neighbours too: said beside the timings
        facts["loadavg_1m"] = round(os.getloadavg()[0], 2)
        facts["cpus"] = os.cpu_count()
    except OSError:
        pass
    if device.type == "cuda":
        idx = device.index or 0
        facts["name"] = torch.cuda.get_device_name(idx)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
        facts["bf16_supported"] = bool(torch.cuda.is_bf16_supported())
        facts["cuda"] = torch.version.cuda
        facts["total_memory_bytes"] = int(torch.cuda.get_device_properties(idx).total_memory)
    elif device.type == "cpu":
        name, flags = "", set()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
        except OSError:
            import platform

            name = platform.processor()
        facts["name"] = name
        facts["threads"] = torch.get_num_threads()
        facts["capability"] = torch.backends.cpu.get_cpu_capability()
        facts["native_bf16"] = sorted(f for f in ("avx512_bf16", "amx_bf16") if f in flags)
        if not flags:  # no /proc/cpuinfo: ask torch's own CPU feature probe
            probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
            facts["native_bf16"] = ["avx512_bf16"] if probe and probe() else []
        facts["native_fp16"] = sorted(f for f in ("avx512_fp16", "amx_fp16") if f in flags)
    return facts


def _pick_device(torch: Any, wanted: str | None) -> Any:
    if wanted:
        # Touch it: without a usable device torch raises its own error here (e.g. "Torch
        # not compiled with CUDA enabled"), which the rule base explains; accelerate
        # would quietly fall back to the CPU instead.
        torch.empty(1, device=wanted)
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


MAX_LOGITS = 1 << 18  # the drift is measured on at most this many output values (strided)


def _build(spec: dict[str, Any], torch: Any) -> Any:
    user = spec.get("user_model")
    if user:
        from .usermodel import load

        return load(user, spec.get("batch_size"), int(spec.get("seq_len") or 128), int(spec.get("seed", 0)))
    from .models import build

    return build(spec["model"], spec.get("batch_size"), bool(spec.get("stress")), seed=int(spec.get("seed", 0)))


def _sample(t: Any, torch: Any) -> Any:
    flat = t.detach().float().cpu().reshape(-1)
    if flat.numel() > MAX_LOGITS:
        stride = -(-flat.numel() // MAX_LOGITS)
        flat = flat[::stride]
    return flat.contiguous()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    mode, steps, warmup = spec["mode"], int(spec["steps"]), int(spec["warmup"])
    fault = _fault(mode)
    emit("phase", name="import")
    # These two test the parent, not torch: they happen before the (slow) import.
    if "hang" in fault:
        # with a grandchild in its process group, as a DataLoader worker would be
        import subprocess

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", spec.get("result_path", "")])
        while True:
            time.sleep(1)
    if "abort" in fault:
        os.abort()
    import accelerate
    import torch
    from accelerate import Accelerator

    from .headroom import HeadroomMeter
    from .observe import attach

    device = _pick_device(torch, spec.get("device"))
    if spec.get("stress"):
        # The stress gain drives GELU's tail into denormals, which are ~15x slower on
        # x86 and would time the CPU's denormal path rather than the precision mode.
        torch.set_flush_denormal(True)
    emit("phase", name="model")
    work = _build(spec, torch)
    emit("phase", name="accelerator")
    accelerator = Accelerator(mixed_precision=mode, cpu=device.type == "cpu")
    device = accelerator.device
    native_fp16 = None
    if device.type == "cpu" and mode == "fp16" and not accelerator.native_amp:
        # accelerate 1.x runs fp32 for fp16 on the CPU. What torch's own CPU autocast
        # would do with this model, same weights and batch, so the report can say it
        # (before the watch is attached: this forward is not part of the mode's run).
        native_fp16 = _torch_autocast_fp16(torch, work, work.eval_batch)
    model = work.model
    if "dtype" in fault:
        model = model.half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(spec.get("lr", 1e-3)))
    model, optimizer = accelerator.prepare(model, optimizer)
    from .usermodel import to_device

    batches = [to_device(b, device) for b in work.batches]
    eval_batch = to_device(work.eval_batch, device)
    recorder = getattr(work.model, "record", None) is not None  # the built-in models keep their own peak

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # torch-fp16: fp16 as it runs on a GPU (torch autocast in float16 and a GradScaler),
    # on a device where accelerate would have trained fp32
    scaler = torch.amp.GradScaler(device.type) if "torch-fp16" in fault and mode == "fp16" else None

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=torch.float16) if scaler is not None else accelerator.autocast()

    # Fixed-batch evaluation at the seed's weights, in this mode: the logits every mode
    # is compared with, and how close its activations come to the fp16 limit. The
    # headroom meter watches it and the warm-up steps (one read per step).
    emit("phase", name="eval")
    headroom = HeadroomMeter(work.model)
    if recorder:
        work.model.record = True
    work.model.eval()  # no dropout: the logits compared across modes are the model's, not its noise
    with torch.no_grad(), autocast():
        out = work.forward(model, eval_batch)
        eval_loss = float(work.compute_loss(out, eval_batch))
        logits = work.output_tensor(out)
    work.model.train()
    headroom.step_end()
    if recorder:
        work.model.record = False
    logits32 = _sample(logits, torch) if logits is not None else torch.zeros(0)
    del out, logits
    logits_path = Path(spec["logits_path"])
    # Through array, not .numpy(): torch does not require numpy.
    logits_path.write_bytes(array("f", logits32.tolist()).tobytes())
    eval_facts = {"loss": eval_loss,
                  "peak_abs": work.model.peak_abs if recorder else headroom.summary()["peak_abs"],
                  "nonfinite_logits": int((~torch.isfinite(logits32)).sum()),
                  "logits_file": str(logits_path), "logits_count": logits32.numel()}

    # Watched from the first training step on (its step numbers are the training's; the
    # fixed-batch evaluation above is not part of the run it reports) through the
    # warm-up steps, where autocast's first matmul, the scaler's first steps and an
    # overflow from the start all show. The timed steps after them run bare, so the
    # speed-ups compare precisions, not instrumentation; the probe's own loss and
    # skipped-step checks (free: the loss is read anyway) cover every step.
    observer = attach(accelerator, model, watch="nowatch" not in fault, scaler=scaler)

    def train_step(batch: Any) -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        with autocast():
            out = work.forward(model, batch)
            loss = work.compute_loss(out, batch)
        del out
        if scaler is not None:
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            observer.skipped_now = scaler.get_scale() < before
        else:
            accelerator.backward(loss)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())  # reads the loss: the step's own sync point
        sync()
        return time.perf_counter() - t0, value

    untimed = native_fp16 is not None and scaler is None and not spec.get("full_fp16_on_cpu")
    if untimed and steps > warmup + 2:
        # accelerate's fp16 on this CPU trains fp32: the warm-up steps show it (the first
        # matmul, the scaler that is not there); the rest would time fp32 a second time.
        steps = warmup + 2
    emit("phase", name="train", steps=steps)
    # The same dropout masks in every mode, whatever ran before in this child.
    torch.manual_seed(int(spec.get("seed", 0)) + 2)
    meter = MemoryMeter(torch, device)
    rusage_start = _max_rss()  # the child's peak so far (the reset below starts the loop's own)
    meter.start()
    contention = CpuContention()
    times: list[float] = []
    losses: list[float] = []
    rounds: list[list[float]] = []
    round_started: list[float] = []

    def one_step() -> float:
        i = len(times)
        if i == warmup:
            observer.stop_watching()
            headroom.detach()
        if "nan" in fault and i == 2:
            first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
            with torch.no_grad():
                first.weight.view(-1)[0] = float("nan")
        if "oom" in fault and i == 1:
            # A real allocation failure, with the allocator's own message.
            torch.empty(1 << 52, dtype=torch.uint8, device=device)
        dt, value = train_step(batches[i % len(batches)])
        if i < warmup:
            headroom.step_end()
        observer.step_done(value)
        times.append(dt)
        losses.append(value)
        emit("step", step=i + 1, of=steps)
        return dt

    for _ in range(warmup):
        one_step()
    if not spec.get("driven") or untimed:
        # the steps left, here and now (a mode that is not timed against the others)
        contention.begin()
        while len(times) < steps:
            one_step()
        contention.end()
    if spec.get("driven"):
        # The parent times the modes in rounds, one mode after the other: "run K" runs
        # K steps and answers with their times; "finish" ends it (the parent gone: exit).
        emit("ready", timed=not untimed, steps=len(times))
        while True:
            line = sys.stdin.readline()
            if not line:
                raise SystemExit(0)  # the parent is gone: nobody to finish for
            words = line.split()
            if not words or words[0] != "run":
                break
            contention.begin()
            round_started.append(time.monotonic())  # the system-wide clock: the parent can order the rounds
            got = [one_step() for _ in range(max(1, int(words[1])))]
            contention.end()
            rounds.append(got)
            emit("round", times=got)
    steps = len(times)
    headroom.detach()
    peak = meter.peak()
    others = contention.others_share()
    watched = observer.summary()
    # fp8 shows in the modules accelerate swapped in (TransformerEngine / torchao),
    # not in a matmul's output dtype.
    fp8_modules = sum(1 for m in model.modules()
                      if type(m).__module__.startswith(("transformer_engine", "torchao", "msamp")))
    observer.detach()

    describe = dict(work.describe)
    describe["loss"] = work.loss_words()
    result: dict[str, Any] = {
        "mode": mode, "ok": True, "device": _device_facts(torch, device),
        "accelerate": accelerate.__version__, "accelerator_mixed_precision": accelerator.mixed_precision,
        "workload": describe, "steps": steps, "warmup": warmup,
        "step_times_s": times, "round_times_s": rounds, "round_started_s": round_started,
        "step_time_s": (statistics.median(min(r) for r in rounds) if rounds
                        else statistics.median(times[warmup:] or times)),
        "losses": losses, "final_loss": losses[-1] if losses else None,
        "peak_memory_bytes": peak, "memory_kind": meter.kind, "cpu_used_by_others": others,
        "max_rss_bytes": max(rusage_start or 0, _max_rss() or 0) or None,
        "autocast_dtype": watched["autocast_dtype"], "fp8_modules": fp8_modules,
        "native_amp": bool(accelerator.native_amp), "observed": watched, "eval": eval_facts,
        "headroom": headroom.summary(),
        "stress": bool(spec.get("stress")), "stress_gain": getattr(work.model, "stress_gain", None),
    }
    if device.type == "cuda":
        result["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))

    if spec.get("measure_overhead"):
        result["overhead"] = _overhead(spec, accelerator, model, fault, scaler, train_step, batches, steps)

    if native_fp16 is not None:
        result["torch_autocast_fp16"] = native_fp16
    from ..env.inprocess import collect_in_process

    result["env"] = collect_in_process()  # the env rules judge the mode's real environment

    if spec.get("max_batch"):
        emit("phase", name="max-batch")
        del batches, eval_batch
        result["max_batch"] = _max_batch(spec, torch, device, work, model, train_step, to_device)
    return result


def _overhead(spec: dict[str, Any], accelerator: Any, model: Any, fault: set[str], scaler: Any,
              train_step: Any, batches: list[Any], steps: int) -> dict[str, Any]:
    """What the watch costs, in pairs: a step with it attached (after one untimed step
    that takes its first-step work) beside a bare step, alternating which goes first, so
    a neighbour's burst lands on both alike. Pairs until the ratio's interval is narrow
    or settled about "no overhead", at most twice the overhead steps (five at least)
    and within the overhead budget."""
    from .observe import attach
    from .stability import figure

    # five pairs at least: fewer give no interval for the median (probe/stability.py)
    k = max(5, int(spec.get("overhead_steps", 5)))
    budget = float(spec.get("overhead_budget_s") or 20.0)
    started = time.monotonic()
    watched: list[float] = []
    bare: list[float] = []
    ratios: list[float] = []
    source = None
    n = steps

    def step() -> float:
        nonlocal n
        dt, value = train_step(batches[n % len(batches)])
        n += 1
        return dt

    def with_watch() -> float:
        nonlocal source
        again = attach(accelerator, model, watch="nowatch" not in fault, scaler=scaler)
        source = again.summary().get("source")
        try:
            step()  # its first step: the hooks' one-time work, not the steady cost
            dt, value = train_step(batches[n % len(batches)])
            again.step_done(value)
            return dt
        finally:
            again.detach()

    while len(ratios) < 2 * k:
        if len(ratios) % 2 == 0:
            w, b = with_watch(), step()
        else:
            b, w = step(), with_watch()
        watched.append(w)
        bare.append(b)
        ratios.append(w / b if b > 0 else float("inf"))
        fig = figure(ratios, (1.0,))
        if len(ratios) >= k and (fig.precise or fig.settled):
            break
        if time.monotonic() - started > budget:
            break  # what it has is reported, and called unreliable if it is
    fig = figure(ratios, (1.0,))
    return {"steps": len(ratios), "watched_median_s": statistics.median(watched),
            "bare_median_s": statistics.median(bare), "ratio": fig.value, "low": fig.low, "high": fig.high,
            "reliable": fig.reliable and fig.value is not None, "source": source}


def _max_rss() -> int | None:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return None


def _max_batch(spec: dict[str, Any], torch: Any, device: Any, work: Any, model: Any,
               train_step: Any, to_device: Any) -> dict[str, Any]:
    from . import maxbatch

    # The cap holds for the search only: the mode's own measurements above ran without it.
    cap_kind = None
    if spec.get("memory_limit") and maxbatch.cap_address_space(int(spec["memory_limit"])):
        cap_kind = "--memory-limit"
    elif device.type == "cpu":
        cap = maxbatch.default_cap()
        if cap and maxbatch.cap_address_space(cap):
            cap_kind = "90% of available memory"
    deadline = spec.get("max_batch_deadline")

    def try_step(n: int) -> None:
        batch = to_device(work.make_batch(n), device)
        try:
            train_step(batch)
        finally:
            del batch
            model.zero_grad(set_to_none=True) if hasattr(model, "zero_grad") else None

    try:
        found = maxbatch.search(try_step, int(work.describe.get("batch_size") or 1), int(spec["max_batch"]),
                                torch, device, deadline=(time.monotonic() + float(deadline)) if deadline else None,
                                capped=cap_kind is not None)
    except Exception as exc:  # the mode's measurements stand; the search says why it has no answer
        found = {"batch": None, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    found["cap"] = cap_kind or ("device memory" if device.type != "cpu" else None)
    if spec.get("memory_limit"):
        found["memory_limit_bytes"] = int(spec["memory_limit"])
    return found


def _torch_autocast_fp16(torch: Any, work: Any, eval_batch: Any) -> dict[str, Any]:
    from .headroom import HeadroomMeter

    seen: list[str] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: seen.append(dtype_name(o.dtype)))
             for m in work.model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    recorder = getattr(work.model, "record", None) is not None
    if recorder:
        work.model.record, work.model.peak_abs = True, 0.0
    meter = HeadroomMeter(work.model)
    work.model.eval()
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            out = work.output_tensor(work.forward(work.model, eval_batch))
    finally:
        work.model.train()
        meter.detach()
        if recorder:
            work.model.record = False
        for h in hooks:
            h.remove()
    room = meter.summary()
    return {"autocast_dtype": seen[0] if seen else None,
            "nonfinite_logits": int((~torch.isfinite(out.float())).sum()) if out is not None else 0,
            "peak_abs": work.model.peak_abs if recorder else room["peak_abs"],
            "first_nonfinite": room["first_nonfinite"], "closest": room["closest"][:3]}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    try:
        result = run(spec)
    except Exception as exc:
        from .usermodel import ModelLoadError

        if not isinstance(exc, ModelLoadError):
            raise
        # The SPEC gives no model: the parent says so and stops (exit status 2).
        err = Path(spec["result_path"] + ".spec-error")
        err.write_text(str(exc))
        sys.stderr.write(f"mpdoctor: --model {spec.get('user_model', {}).get('spec')}: {exc}\n")
        return 3
    tmp = Path(spec["result_path"] + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(spec["result_path"])
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
