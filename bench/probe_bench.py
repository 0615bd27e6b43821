"""The probe's verdict stability and wall time: the probe run N times, in one run.

    python bench/probe_bench.py [--runs 10] [--model transformer] [--modes no,fp16,bf16,fp8]
    python bench/probe_bench.py --runs 1 --model fixtures/probe/models/gpt2-10m.json  # a 10.6M-parameter
                                                      # GPT-2 from its config: target < 120 s for 4 modes
    python bench/probe_bench.py --runs 4 --compare /path/to/older/checkout   # before/after, runs alternated

Printed, over the N runs: the verdict distribution (the recommended mode and its basis,
with "timings unreliable" a verdict withheld), the wall times (median, min, max; target:
the default probe under 60 s, four modes of a 10M-parameter --model under 120 s, on the
2-core development CPU, calm), and each mode's speed-up over fp32 (min / median / max
across runs, and in how many runs the probe called it reliable), the instrumentation
overhead likewise, and the CPU share other processes used (a busy machine says so).
Goal: the same verdict in at least 9 of 10 calm runs.

With --compare ROOT the same probe of another checkout (e.g. `git archive` of an older
commit) runs alternately with this one's, so a neighbour's load falls on both alike.
A bare `python -c "import torch, accelerate; ..."` child is timed once per run: the
floor one probe child cannot go below.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ("import torch, accelerate; from accelerate import Accelerator; "
         "torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())")


def timed(cmd: list[str], root: Path) -> tuple[float, str, int, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    return time.perf_counter() - t0, out.stdout, out.returncode, out.stderr


def verdict(data: dict) -> str:
    rec = data.get("recommendation") or {}
    basis = rec.get("basis") or ""
    if basis == "timings unreliable":
        return "withheld (timings unreliable)"
    return f"{rec.get('mode')} ({basis or 'no basis'})"


def spread(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def summarise(label: str, runs: list[dict], walls: list[float], target: float) -> None:
    n = len(runs)
    print(f"== {label}: {n} run(s)")
    if not runs:
        return
    counts = collections.Counter(verdict(d) for d in runs)
    top, k = counts.most_common(1)[0]
    print("  verdicts: " + "; ".join(f"{v}: {c}/{n}" for v, c in counts.most_common()))
    print(f"  most common verdict in {k}/{n} runs ({k / n:.0%}; goal >= 90% calm)")
    med = statistics.median(walls)
    print(f"  wall time: median {med:.1f} s, min {min(walls):.1f} s, max {max(walls):.1f} s "
          f"[target < {target:.0f} s calm: {'ok' if med < target else 'MISSED'}]")
    modes = [m["mode"] for m in runs[0]["modes"]]
    for mode in modes:
        rows = [next((m for m in d["modes"] if m["mode"] == mode), {}) for d in runs]
        speed = [m["speedup"] for m in rows if m.get("speedup") is not None]
        # an older probe has no per-mode flag: its recommendation's timings_reliable
        reliable = sum(1 for m, d in zip(rows, runs) if m.get("speedup") is not None
                       and (m["speedup_reliable"] if m.get("speedup_reliable") is not None
                            else (d.get("recommendation") or {}).get("timings_reliable", True)))
        ms = [m["step_time_s"] * 1000 for m in rows if m.get("step_time_s")]
        busy = [m["cpu_used_by_others"] for m in rows if m.get("cpu_used_by_others") is not None]
        rounds = [m["rounds"] for m in rows if m.get("rounds")]
        line = f"  {mode:<5} speed-up min/median/max {spread(speed)}"
        if speed:
            line += f" (x{max(speed) / min(speed):.1f} apart), reliable in {reliable}/{len(speed)}"
        line += f"; step ms {spread(ms)}"
        if rounds:
            line += f"; rounds {min(rounds)}-{max(rounds)}"
        if busy:
            line += f"; others used {min(busy):.0%}-{max(busy):.0%} of the CPUs"
        if not speed and not ms:
            ok = sum(1 for m in rows if m.get("ok"))
            line = f"  {mode:<5} trained in {ok}/{n} runs" + (f" ({rows[0].get('error')})" if rows[0].get("error") else "")
        print(line)
    oh = [d["overhead"] for d in runs if d.get("overhead") and d["overhead"].get("ratio") is not None]
    if oh:
        ratios = [o["ratio"] for o in oh]
        rel = sum(1 for o in oh if o.get("reliable", True))
        print(f"  instrumentation overhead min/median/max {spread(ratios)}, reliable in {rel}/{len(oh)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--modes", default=None, help="default: the probe's own (all four)")
    ap.add_argument("--steps", default=None, help="default: the probe's own (adaptive)")
    ap.add_argument("--compare", metavar="ROOT", default=None,
                    help="another checkout of mpdoctor to run alternately (before/after)")
    args = ap.parse_args()
    probe_cmd = [sys.executable, "-m", "mpdoctor", "probe", "--model", args.model, "--format", "json"]
    if args.modes:
        probe_cmd += ["--modes", args.modes]
    if args.steps:
        probe_cmd += ["--steps", args.steps]
    roots = [("this checkout", ROOT)] + ([("compared", Path(args.compare).resolve())] if args.compare else [])
    results: dict[str, list[dict]] = {label: [] for label, _ in roots}
    walls: dict[str, list[float]] = {label: [] for label, _ in roots}
    floors = []
    started = time.perf_counter()
    for i in range(args.runs):
        floors.append(timed([sys.executable, "-c", FLOOR], ROOT)[0])
        for label, root in (roots if i % 2 == 0 else roots[::-1]):  # alternated: neither always first
            wall, out, rc, err = timed(probe_cmd, root)
            try:
                data = json.loads(out)
            except ValueError:
                print(f"run {i + 1} ({label}): exit {rc}, no JSON: {err.strip()[-300:]}", file=sys.stderr)
                continue
            results[label].append(data)
            walls[label].append(wall)
            print(f"run {i + 1} ({label}): {wall:.1f} s, {verdict(data)}; "
                  + ", ".join(f"{m['mode']} {m['speedup']:.2f}x" + ("?" if m.get("speedup_reliable") is False else "")
                              for m in data["modes"] if m.get("speedup") is not None),
                  flush=True)
    target = 60 if args.model in ("transformer", "mlp", "conv") else 120
    print(f"\nprobe --model {args.model} {' '.join(probe_cmd[8:])}: {args.runs} run(s) each, "
          f"{time.perf_counter() - started:.0f} s in all; load average now {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    for label, _ in roots:
        summarise(label, results[label], walls[label], target)
    print(f"one bare torch+accelerate child: median {statistics.median(floors):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
