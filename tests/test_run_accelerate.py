"""Two real processes under `accelerate launch` on the CPU (MULTI_CPU, gloo): each rank
records its own report and the wrapper says which rank failed first and what the other did."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    """A port nobody listens on now: a fixed one collides with another run on a busy machine
    (the launch then fails before any rank trains)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_first_failure_and_the_waiting_peer(tmp_path: Path) -> None:
    accelerate = shutil.which("accelerate", path=str(Path(PY).parent)) or "accelerate"
    report = tmp_path / "report.json"
    # accelerate 1.x: `--cpu --num_processes 2` runs one process unless MPI is installed;
    # `--multi_gpu` on a machine without GPUs starts torchrun workers that pick MULTI_CPU/gloo.
    cmd = [PY, "-m", "mpdoctor", "run", "--report", str(report), "--", accelerate, "launch", "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(ROOT / "fixtures" / "scripts" / "two_ranks.py")]
    p = subprocess.run(cmd, capture_output=True, timeout=180, cwd=tmp_path)
    data = json.loads(report.read_text())
    assert "ranks" in data, p.stderr.decode()[-3000:]
    assert p.returncode == data["exit_code"] == 1
    assert b"step 1 loss" in p.stdout
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert set(ranks) == {0, 1}
    assert ranks[1]["status"] == "failed first" and ranks[1]["step"] == 2 and ranks[1]["module"] == "encoder"
    assert "same dtype" in ranks[1]["exception"]
    assert ranks[0]["status"] != "finished" and ranks[0]["step"] == 2  # it was left waiting at the same step
    top = data["findings"][0]
    assert top["category"] == "dtype-mismatch"
    assert top["facts"]["module"] == "encoder" and 1 in top["ranks"]
    summary = [f for f in data["findings"] if f["rule"] == "rank-summary"][0]
    assert summary["facts"]["first_failed_rank"] == 1
    assert summary["title"].startswith("Rank 1 failed first in `encoder` at step 2; rank 0 ")
    assert data["precision_plan"]["distributed_type"] == "MULTI_CPU"
    assert data["precision_plan"]["num_processes"] == 2
