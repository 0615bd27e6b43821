"""The GPU kit (bench/gpu/run.sh) cannot rot: its CPU dry run, through the same script
and driver as on a GPU machine, writes the summary table and outputs that parse.

Lean on purpose (the whole kit's dry run takes minutes on a loaded 2-core box): the
steps every face shares run here (env, install by PYTHONPATH with the carried wheels,
one `mpdoctor run` of a kit script, the sync count, the step bench on a tiny decoder in
bf16 and fp16 + GradScaler); `bash bench/gpu/run.sh OUT --device cpu --small` runs them all.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_cpu_dry_run_writes_the_summary_and_outputs_that_parse(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    import sys

    out = tmp_path / "kit"
    # the kit's budget is room, not a bound: a busy machine (other suites beside this one)
    # must not turn a slow step into "out of time"; on an idle one the whole run is well under it
    p = subprocess.run([bash, str(ROOT / "bench" / "gpu" / "run.sh"), str(out), "--device", "cpu", "--small",
                        "--install", "pythonpath", "--only", "run-dtype_mismatch,sync,bench", "--jobs", "2",
                        "--budget", "420"], capture_output=True, text=True, timeout=480,
                       env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    data = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in data["steps"]}
    assert data["installed_with"].startswith("PYTHONPATH") and data["device"] == "cpu"
    for name in ("env", "install (PYTHONPATH)", "run-dtype_mismatch", "sync", "bench"):
        assert steps[name]["status"] == "ok", (name, steps[name])
        assert re.search(rf"^\| {re.escape(name)} \| ok \| [\d.]+ s \|", summary, re.M), name
    assert "mpdoctor from the checkout" in summary and "| step | status | time |" in summary

    report = json.loads((out / "run-dtype_mismatch" / "report.json").read_text())
    assert report["findings"][0]["rule"] == "matmul-operands-dtype"
    assert "found matmul-operands-dtype" in steps["run-dtype_mismatch"]["note"]

    sync = json.loads((out / "sync.json").read_text())
    assert sync["ok"] and max(sync["python_reads"]["extra"]) <= 1 and sync["cuda_sync_warnings"] is None

    bench = json.loads((out / "step-bench.json").read_text())
    assert set(bench["precisions"]) == {"bf16", "fp16"}
    for rows in bench["precisions"].values():
        assert set(rows) == {"bare", "mpdoctor", "mpdoctor every=4", "detect_anomaly", "DebugUnderflowOverflow"}
        assert rows["bare"]["ratio"] == 1.0 and all(r["median_ms"] > 0 for r in rows.values())
        assert rows["mpdoctor"]["internal_errors"] == [] and rows["mpdoctor every=4"]["watched_steps"] == 3
    # the cost table, one row per precision and configuration
    assert "## Instrumentation cost" in summary
    assert re.search(r"^\| fp16 \+ GradScaler \| mpdoctor every=4 \| [\d.]+ ms \| [\d.]+× \|", summary, re.M)
