"""`mpdoctor check` against the tools it replaces, side by side, in one run.

    python bench/check_bench.py [--runs 5]

Runs each command --runs times, interleaved (so machine load hits all alike), and
prints the median wall time of each and the ratios the issue sets as targets:
check <= 1x `python -m torch.utils.collect_env`, <= 1x `accelerate env`, and
<= 1.5x `python -c "import torch"`. `check --snapshot` (no torch at all) is shown too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def script(name: str, fallback: list[str]) -> list[str]:
    """The console script next to this interpreter (what a user types), else `python -m`."""
    path = Path(sys.executable).with_name(name)
    return [str(path)] if path.exists() else (shutil.which(name) and [shutil.which(name)]) or fallback


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    py = sys.executable
    mpdoctor = script("mpdoctor", [py, "-m", "mpdoctor"])
    snap = Path(tempfile.mkdtemp()) / "snap.json"
    subprocess.run(mpdoctor + ["collect", "-o", str(snap)], check=True, capture_output=True)
    commands = {
        "import torch": [py, "-c", "import torch"],
        "mpdoctor check": mpdoctor + ["check"],
        "collect_env": [py, "-m", "torch.utils.collect_env"],
        "accelerate env": script("accelerate", [py, "-m", "accelerate.commands.accelerate_cli"]) + ["env"],
        "mpdoctor check --snapshot": mpdoctor + ["check", "--snapshot", str(snap)],
    }
    for cmd in commands.values():  # warm the page cache once
        timed(cmd)
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            times[name].append(timed(cmd))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.runs} interleaved runs each, median wall seconds (min):")
    for name, v in times.items():
        print(f"  {name:<28} {med[name]:6.2f}  ({min(v):.2f})")
    check = med["mpdoctor check"]
    print("ratios (target):")
    print(f"  check / collect_env          {check / med['collect_env']:.2f}  (<= 1.0)")
    print(f"  check / accelerate env       {check / med['accelerate env']:.2f}  (<= 1.0)")
    print(f"  check / import torch         {check / med['import torch']:.2f}  (<= 1.5)")
    print(f"  collect_env / import torch   {med['collect_env'] / med['import torch']:.2f}")
    print(f"  accelerate env / import torch {med['accelerate env'] / med['import torch']:.2f}")
    print(f"  check --snapshot / import torch {med['mpdoctor check --snapshot'] / med['import torch']:.2f}")
    os.unlink(snap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
