"""Speed and memory of `mpdoctor explain` over a job folder (issue 20 item 1), as the
ratio against `grep -rE` over the same folder.

    python bench/job_bench.py                 # 1,024 ranks x 1 MiB (1 GiB), 3 interleaved runs
    python bench/job_bench.py --ranks 256 --mib 1 --runs 3

The folder is made once in /tmp (never the repo) from recorded rank logs
(fixtures/jobs/rank-raises): torchrun's --log-dir layout, 128 nodes x 8 local ranks, each
rank's stderr.log about 1 MiB of training lines (`[rankN]: step ... loss ...`, a warning
now and then) ending in that rank's recorded error (rank 1 raised a ValueError, every
other rank lost its peer). The baseline is `grep -rE -i -c` with one literal phrase per
log rule (as bench/explain_bench.py), output read through a pipe; mpdoctor is
`mpdoctor explain DIR --format json`. Medians of interleaved runs; mpdoctor's peak memory
by psutil. Targets: within 3x of grep, under 300 MB, and the right first rank (1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import explain_bench as eb  # noqa: E402  (the same baseline helpers)

RECORDED = ROOT / "fixtures" / "jobs" / "rank-raises"


def recorded_tails() -> tuple[str, str]:
    """(the raising rank's stderr, a peer's stderr) as recorded, rank prefixes as {R}."""
    raised = peer = None
    for p in sorted(RECORDED.glob("*/job1_*/attempt_0/*/stderr.log")):
        text = p.read_text()
        if "ValueError" in text:
            raised = text
        elif "Connection closed by peer" in text and peer is None:
            peer = text
    assert raised and peer, "fixtures/jobs/rank-raises is incomplete"
    strip = re.compile(r"\[rank\d+\]:")
    return strip.sub("[rank{R}]:", raised), strip.sub("[rank{R}]:", peer)


def filler(size: int, rng: random.Random) -> str:
    lines = []
    n = 0
    step = 0
    while n < size:
        step += 1
        if step % 500 == 0:
            line = ("[rank{R}]: /opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:665: "
                    "UserWarning: This DataLoader will create 8 worker processes in total.\n")
        else:
            line = (f"[rank{{R}}]: step {step} loss {rng.random() * 3:.4f} lr {3e-4 * rng.random():.3e} "
                    f"grad_norm {rng.random() * 5:.3f} tokens/s {rng.randint(9000, 15000)} "
                    f"mem {rng.uniform(20, 70):.1f}GB\n")
        lines.append(line)
        n += len(line)
    return "".join(lines)


def make_job(folder: Path, ranks: int, mib: float) -> Path:
    mark = folder / ".complete"
    if mark.exists() and mark.read_text() == f"{ranks} {mib}":
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    raised, peer = recorded_tails()
    body = filler(int(mib * 1024 * 1024) - len(peer), random.Random(20))
    per_node = 8
    for r in range(ranks):
        node, local = divmod(r, per_node)
        d = folder / f"node{node:03d}" / "job1_bench" / "attempt_0" / str(local)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stderr.log").write_text((body + (raised if r == 1 else peer)).replace("{R}", str(r)))
    mark.write_text(f"{ranks} {mib}")
    return folder


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    folder = make_job(Path("/tmp") / f"mpdoctor-bench-job-{args.ranks}x{args.mib:g}", args.ranks, args.mib)
    size = sum(p.stat().st_size for p in folder.rglob("stderr.log"))
    phrases = eb.grep_phrases()
    pattern = "|".join(re.escape(p) for p in phrases)
    grep = shutil.which("grep") or "grep"
    explain = [sys.executable, "-m", "mpdoctor", "explain", str(folder), "--format", "json"]
    cmds = {"grep -rE": [grep, "-r", "-E", "-i", "-c", pattern, str(folder)], "mpdoctor explain": explain}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmds["grep -rE"], capture_output=True)  # page cache warm for both
    times = eb.interleaved(cmds, args.runs, cwd=ROOT, env=env)
    g, m = statistics.median(times["grep -rE"]), statistics.median(times["mpdoctor explain"])
    peak = eb.peak_rss_mb(explain)
    out = subprocess.run(explain, capture_output=True, text=True, cwd=ROOT, env=env)
    report = json.loads(out.stdout)
    first = report.get("job", {}).get("first_failure", {})
    print(f"job folder: {args.ranks} ranks, {size / 2**30:.2f} GiB ({folder})")
    print(f"  grep -rE -i ({len(phrases)} rule phrases)  {g:7.2f} s   ({size / g / 1e6:.0f} MB/s)")
    print(f"  mpdoctor explain DIR              {m:7.2f} s   ({size / m / 1e6:.0f} MB/s)")
    print(f"  ratio {m / g:.2f}x (target <= 3x)   peak memory {peak:.0f} MB (target < 300 MB)")
    print(f"  first failure: rank {first.get('rank')} ({first.get('cause')}); "
          f"top finding {report['findings'][0]['rule'] if report['findings'] else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
