"""Benchmarks for `mpdoctor run`, printed as ratios to the bare baseline (no asserts).

(a) passthrough: a chatty child printing 3 million short lines, wrapped vs bare wall
    and CPU time, with its stdout to /dev/null, to a file and to a pipe;
(b) step overhead on the CPU bench model (4-layer TransformerEncoder, d_model 256,
    sequence 128, batch 8, bf16 autocast), forward + backward + optimizer step:
    mpdoctor's instrumentation vs torch.autograd.detect_anomaly(check_nan=True) vs
    transformers' DebugUnderflowOverflow, each as a ratio to the bare step.

    python bench/run_bench.py                # both
    python bench/run_bench.py --only step --steps 20
    python bench/run_bench.py --only step --recipe    # the AMP recipe's calls in each step
    python bench/run_bench.py --only passthrough --unbuffered --targets devnull,pipe
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench_passthrough(lines: int, repeats: int, targets: list[str], unbuffered: bool = False) -> None:
    """The chatty child: `lines` short lines printed, bare vs wrapped, with its stdout on
    each of `targets` (/dev/null, a file, a pipe read by us), runs interleaved so that
    machine noise hits both alike; medians of wall time and of CPU time (the child's and
    mpdoctor's, user + system)."""
    import resource

    child = [sys.executable, "-c", f"import sys\nw = sys.stdout.write\nfor i in range({lines}): w(f'line {{i}} "
                                   f"loss 0.{{i % 9973:04d}}\\n')"]
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)  # a training script's stdout to a file is block-buffered
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"  # one write per line: the pump's worst case
    wrapped = [sys.executable, "-m", "mpdoctor", "run", "--"] + child

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def timed(cmd: list[str], target: str) -> tuple[float, float]:
        c0, start = cpu(), time.perf_counter()
        if target == "pipe":
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
            while proc.stdout.read1(1 << 20):  # type: ignore[union-attr]
                pass
            assert proc.wait() == 0
        else:
            with (open(os.devnull, "wb") if target == "devnull" else tempfile.TemporaryFile()) as out:
                subprocess.run(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env, check=True, cwd=ROOT)
        return time.perf_counter() - start, cpu() - c0

    print(f"passthrough, a child printing {lines:,} lines ({'unbuffered' if unbuffered else 'block-buffered'}), "
          f"median of {repeats}; wrapped / bare (goal <= 1.2x):")
    for target in targets:
        bare, wrap = [], []
        for _ in range(repeats):  # interleaved, so that machine noise hits both alike
            bare.append(timed(child, target))
            wrap.append(timed(wrapped, target))
        bw, ww = statistics.median(t for t, _ in bare), statistics.median(t for t, _ in wrap)
        bc, wc = statistics.median(c for _, c in bare), statistics.median(c for _, c in wrap)
        print(f"  stdout -> {target:8s} wall: bare {bw:6.2f} s, wrapped {ww:6.2f} s -> {ww / bw:.2f}x    "
              f"cpu: bare {bc:6.2f} s, wrapped {wc:6.2f} s -> {wc / bc:.2f}x")


def bench_step(steps: int, warmup: int, recipe: bool = False, only: list[str] | None = None) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)

    def make():
        layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True,
                                           dropout=0.0)
        model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        return model, torch.optim.SGD(model.parameters(), lr=1e-4)

    x = torch.randn(8, 128, 256)
    scaler = torch.amp.GradScaler("cpu", enabled=recipe)

    def step(model, opt):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        if not recipe:
            loss.backward()
            opt.step()
        else:  # the AMP recipe's calls, every one tapped: scale, backward, unscale_, clip, step, update
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    def mpdoctor_on(model):
        from mpdoctor.instrument import watch

        h = watch()  # process-wide, exactly what `mpdoctor run` installs in the child

        def off():
            h.flush()
            assert not h.internal_errors, h.internal_errors
            h.close()
        return off

    def anomaly_on(model):
        ctx = torch.autograd.detect_anomaly(check_nan=True)
        ctx.__enter__()
        return lambda: ctx.__exit__(None, None, None)

    def debug_on(model):
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(model, max_frames_to_save=21)

        def off():  # it has no remove(); its hooks are forward hooks on every module
            for m in model.modules():
                m._forward_hooks.clear()
        return off

    configs = {"bare": None, "mpdoctor": mpdoctor_on, "detect_anomaly": anomaly_on,
               "DebugUnderflowOverflow": debug_on}
    try:
        import transformers.debug_utils  # noqa: F401
    except ImportError as exc:
        print(f"DebugUnderflowOverflow unavailable: {exc} (pip install transformers)")
        del configs["DebugUnderflowOverflow"]
    if only:
        configs = {k: v for k, v in configs.items() if k == "bare" or k in only}
    import warnings

    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    model, opt = make()
    for _ in range(warmup + 1):
        step(model, opt)
    times: dict[str, list[float]] = {k: [] for k in configs}
    # Interleaved step by step (bare, tool, tool, ..., bare, ...): on a shared machine the
    # noise then falls on every configuration alike. Each tool is switched on for its one
    # step and off after it, so its set-up cost is counted too.
    for _ in range(steps):
        for name, on in configs.items():
            off = on(model) if on else None
            t = time.perf_counter()
            step(model, opt)
            times[name].append(time.perf_counter() - t)
            if off:
                off()
    base_med, base_min = statistics.median(times["bare"]), min(times["bare"])
    print(f"step overhead, TransformerEncoder 4x256, seq 128, batch 8, bf16 autocast, fwd+bwd+step"
          f"{' (GradScaler: scale, unscale_, clip, step, update)' if recipe else ''}, "
          f"{steps} steps each, interleaved, {torch.get_num_threads()} threads; ratio to the bare step:")
    for name in configs:
        med, low = statistics.median(times[name]), min(times[name])
        print(f"  {name:24s} median {med * 1000:8.1f} ms -> {med / base_med:.2f}x    "
              f"best {low * 1000:8.1f} ms -> {low / base_min:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("passthrough", "step"))
    ap.add_argument("--lines", type=int, default=3_000_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--targets", default="devnull,file,pipe",
                    help="where the chatty child's stdout goes, comma-separated (devnull, file, pipe)")
    ap.add_argument("--unbuffered", action="store_true",
                    help="PYTHONUNBUFFERED=1 in the child: one write per line (the default: block-buffered)")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--recipe", action="store_true",
                    help="step bench: the AMP recipe's calls (a CPU GradScaler's scale, unscale_, clip_grad_norm_, "
                         "step, update) in every step, bare and instrumented alike")
    ap.add_argument("--configs", default=None,
                    help="step bench: the tools to time against the bare step, comma-separated (default: all; "
                         "mpdoctor,detect_anomaly,DebugUnderflowOverflow)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for the step bench (default: torch's; 1 is steadier on a shared machine)")
    args = ap.parse_args()
    if args.only in (None, "passthrough"):
        bench_passthrough(args.lines, args.repeats, args.targets.split(","), args.unbuffered)
    if args.only in (None, "step"):
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        bench_step(args.steps, args.warmup, args.recipe, args.configs.split(",") if args.configs else None)


if __name__ == "__main__":
    main()
