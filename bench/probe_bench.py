"""Wall time of the default `mpdoctor probe`, against what it cannot avoid.

    python bench/probe_bench.py [--runs 2] [--model transformer]
    python bench/probe_bench.py --runs 1 --model fixtures/probe/models/gpt2-10m.json  # a 10.6M-parameter
                                                      # GPT-2 from its config: target < 120 s for 4 modes

The probe starts one child per mode (four by default), each importing torch and
accelerate; that start-up is the floor. Printed: the median wall time of the default
probe (target: under 60 s on the 2-core development CPU), the median of one bare
`python -c "import torch, accelerate; torch.optim.AdamW"` child (the per-mode floor),
the probe's ratio to (modes x that floor), and the instrumentation overhead the probe
itself reports. Runs are interleaved so a neighbour's load hits both alike; the
probe's own "Timings are unreliable" line says when the machine was busy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ("import torch, accelerate; from accelerate import Accelerator; "
         "torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())")


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode not in (0, 1):
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return time.perf_counter() - t0, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--model", default="transformer")
    args = ap.parse_args()
    probe_cmd = [sys.executable, "-m", "mpdoctor", "probe", "--model", args.model, "--format", "json"]
    floor_cmd = [sys.executable, "-c", FLOOR]
    probes, floors, reports = [], [], []
    for _ in range(args.runs):
        floors.append(timed(floor_cmd)[0])
        wall, out = timed(probe_cmd)
        probes.append(wall)
        reports.append(json.loads(out))
    last = reports[-1]
    modes = len(last["modes"])
    probe, floor = statistics.median(probes), statistics.median(floors)
    target = 60 if args.model in ("transformer", "mlp", "conv") else 120
    print(f"probe ({args.model}, {modes} modes, {last['options']['steps']} steps): "
          f"median {probe:.1f} s over {args.runs} run(s)  [target < {target} s: {'ok' if probe < target else 'MISSED'}]")
    w = last.get("workload") or {}
    if w.get("spec"):
        print(f"  model {w.get('model')}, {w.get('parameters', 0):,} parameters; batch: {w.get('batch')}")
    for m in last["modes"]:
        if m.get("ok") and m.get("step_time_s"):
            print(f"  {m['mode']:<5} step {m['step_time_s'] * 1000:.0f} ms, speed-up {m.get('speedup') or 0:.2f}x, "
                  f"peak {(m.get('peak_memory_bytes') or 0) / 2**20:.0f} MiB, max RSS {(m.get('max_rss_bytes') or 0) / 2**20:.0f} MiB, "
                  f"loss Δ {m.get('loss_rel_diff') or 0:.2e}, logits Δ {m.get('logits_rel_diff') or 0:.2e}")
    print(f"one bare torch+accelerate child: median {floor:.2f} s; "
          f"probe / ({modes} x child) = {probe / (modes * floor):.2f}x")
    for m in last["modes"]:
        busy = m.get("cpu_used_by_others")
        print(f"  {m['mode']:<5} child {m['wall_s']:.1f} s" + (f", others used {busy:.0%} of the CPUs" if busy else ""))
    oh = last.get("overhead") or {}
    if oh:
        print(f"instrumentation overhead reported by the probe: {oh['ratio']:.2f}x step time ({oh['source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
