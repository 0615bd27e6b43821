"""`mpdoctor probe` for real: real children, real torch on the CPU, real accelerate.

Kept short: few steps, the MLP for most assertions, one run of the default model.
Timings are not asserted (bench/ measures speed); what a user reads is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# find_spec, not importorskip: the parent side never imports torch, nor should its tests.
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None:
    pytest.skip("torch and accelerate are needed for live probe runs", allow_module_level=True)

from mpdoctor import rulebase
from mpdoctor.diagnosis.probe import ModeJudge
from mpdoctor.probe import ProbeOptions  # noqa: E402
from mpdoctor.probe.rows import build_rows  # noqa: E402
from mpdoctor.probe.runner import run_child  # noqa: E402

# every test here starts real probe children (most of them train): the suite's long poles
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MODE_KEYS = {"mode", "ok", "step_time_s", "speedup", "peak_memory_bytes", "memory_saving",
             "loss_rel_diff", "autocast_dtype", "skipped_steps", "findings"}


def _cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpdoctor", "probe", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def default_json() -> dict:
    """The default model (the tiny transformer) and all four modes, through the CLI; a
    batch of 4, not its default 16: every figure asserted here is there at any batch, and
    a step costs a quarter."""
    out = _cli("--steps", "4", "--batch-size", "4", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    return json.loads(out.stdout)


def _mode(data: dict, name: str) -> dict:
    return next(m for m in data["modes"] if m["mode"] == name)


def test_json_shape(default_json):
    assert [m["mode"] for m in default_json["modes"]] == ["no", "fp16", "bf16", "fp8"]
    for m in default_json["modes"]:
        assert MODE_KEYS <= set(m)
    assert {"mode", "reason", "config"} <= set(default_json["recommendation"])
    assert default_json["workload"]["model"] == "transformer"


def test_fp32_and_bf16_really_run(default_json):
    no, bf16 = _mode(default_json, "no"), _mode(default_json, "bf16")
    assert no["ok"] and no["autocast_dtype"] == "float32" and no["speedup"] == 1.0
    assert bf16["ok"] and bf16["autocast_dtype"] == "bfloat16"
    assert bf16["speedup"] is not None and bf16["speedup"] > 0
    assert bf16["peak_memory_bytes"] > 0 and bf16["memory_saving"] is not None
    # same seed and data: bf16 lands near fp32, but not on it
    assert 0 < bf16["loss_rel_diff"] < 0.05
    assert 0 < bf16["logits_rel_diff"] < 0.05


def test_accelerate_fp16_on_cpu_is_reported_as_fp32(default_json):
    fp16 = _mode(default_json, "fp16")
    assert fp16["ok"] is True
    assert fp16["autocast_dtype"] == "float32"
    assert fp16["speedup"] is None and fp16["memory_saving"] is None
    assert fp16["loss_rel_diff"] == 0.0  # it was fp32, bit for bit
    f = fp16["findings"][0]
    # the same knowledge as `mpdoctor check` with fp16 on a CPU, with what the probe saw
    assert (f["rule"], f["category"], f["severity"]) == ("fp16-silently-fp32-on-cpu", "fp16-unsupported-device",
                                                         "warning")
    assert "torch.autocast(\"cpu\", dtype=torch.float16)` does run" in f["explanation"]
    assert f["facts"]["torch_autocast_fp16_dtype"] == "float16" and f["facts"]["observed_dtype"] == "float32"


def test_fp8_says_why_it_is_unavailable(default_json):
    fp8 = _mode(default_json, "fp8")
    assert fp8["ok"] is False
    assert "requires `transformer_engine` or `torchao` to be installed" in fp8["error"]
    assert fp8["findings"] and fp8["findings"][0]["category"] == "fp8-unsupported"


def test_recommendation_names_a_mode_that_ran(default_json):
    rec = default_json["recommendation"]
    assert rec["mode"] in ("no", "bf16")  # fp16 did not run here, fp8 is unavailable
    assert rec["config"]["accelerate_config"] == f"mixed_precision: {rec['mode']}"
    assert rec["reason"].startswith(rec["mode"])  # "no: ..." or "no, for now: ..." on a busy CPU


def test_instrumentation_overhead_is_reported(default_json):
    oh = default_json["overhead"]
    assert oh["bare_median_s"] > 0 and oh["watched_median_s"] > 0 and oh["ratio"] > 0


def test_crashing_modes_are_explained_while_the_others_report():
    """One child dies by a real allocation failure, one by SIGABRT; fp32 still reports.
    Markdown, with stderr on a terminal: the progress bar appears there."""
    master, slave = pty.openpty()
    env = {**os.environ, "MPDOCTOR_PROBE_FAULT": "bf16:oom,fp16:abort", "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, "-m", "mpdoctor", "probe", "--model", "mlp", "--steps", "2",
                             "--modes", "no,fp16,bf16", "--format", "markdown"],
                            stdout=subprocess.PIPE, stderr=slave, cwd=ROOT, env=env)
    os.close(slave)
    tty_out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        tty_out += chunk
    stdout = proc.stdout.read().decode()
    rc = proc.wait(timeout=240)
    os.close(master)
    assert rc == 0, stdout[-4000:]
    assert b"mode no" in tty_out and b"mode bf16" in tty_out  # rich progress, on the terminal only
    assert b"mode no" not in stdout.encode()
    assert "| no | ✓ |" in stdout
    assert "| fp16 | ✗ failed |" in stdout and "| bf16 | ✗ failed |" in stdout
    assert "fp16: killed by SIGABRT during import" in stdout
    assert "DefaultCPUAllocator: can't allocate memory" in stdout
    assert "`host-out-of-memory`" in stdout  # the rule base's explanation of bf16's error
    assert "Recommendation: no" in stdout  # "no:" or, on a busy CPU, "no, for now:"


def test_a_hanging_mode_is_killed_at_its_deadline(tmp_path):
    opts = ProbeOptions(modes=["bf16"], model="mlp", steps=3, timeout_s=3)
    os.environ["MPDOCTOR_PROBE_FAULT"] = "bf16:hang"
    try:
        out = run_child("bf16", opts, tmp_path)
    finally:
        del os.environ["MPDOCTOR_PROBE_FAULT"]
    # killed at its deadline: the outcome says so (no wall-clock bound here: bench/ times things)
    assert out.timed_out and out.result is None
    row = build_rows([out], opts, ModeJudge(rulebase.load()))[0]
    assert row.ok is False and row.timed_out
    assert row.error == "timed out after 3 s during import; the child was killed"
    # the whole process group is gone, not left running
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "bf16.spec.json") not in ps


def test_stress_shows_fp16_overflow_and_bf16_headroom():
    out = _cli("--model", "mlp", "--steps", "3", "--modes", "no,fp16,bf16", "--stress", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    no, fp16, bf16 = (_mode(data, m) for m in ("no", "fp16", "bf16"))
    # the stressed activations pass fp16's limit, and fp32 and bf16 hold them
    assert no["peak_activation"] > 65504 and no["nonfinite_count"] == 0
    assert bf16["ok"] and bf16["autocast_dtype"] == "bfloat16"
    assert bf16["peak_activation"] > 65504 and bf16["nonfinite_count"] == 0
    # accelerate's fp16 ran fp32 on this CPU: no overflow in it, said honestly, and
    # torch's own fp16 autocast on the same batch does overflow
    assert fp16["autocast_dtype"] == "float32" and fp16["nonfinite_count"] == 0
    stress = next(f for f in fp16["findings"] if f["rule"] == "stress-fp16-not-exercised")
    assert stress["category"] == "fp16-value-overflow"
    assert "ran float32 on this machine, so nothing overflowed" in stress["explanation"]
    assert "the same batch does overflow" in stress["explanation"]


def test_a_missing_device_is_the_rule_base_finding_not_a_silent_cpu_run():
    # accelerate would fall back to the CPU; the probe asks torch for the device, and
    # torch's own error is explained.
    out = _cli("--device", "cuda", "--modes", "no", "--steps", "2", "--model", "mlp", "--format", "json")
    assert out.returncode == 1  # no mode trained
    row = json.loads(out.stdout)["modes"][0]
    assert row["ok"] is False and "CUDA" in row["error"]
    assert row["findings"] and row["findings"][0]["category"] == "cuda-unavailable"


def _probe_processes(marker: str) -> list[tuple[int, str]]:
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [(int(line.split(None, 1)[0]), line) for line in ps.splitlines() if marker in line]


@pytest.mark.slow
@pytest.mark.parametrize("sig, expected_rc", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_signal_to_probe_kills_the_childs_group_and_removes_its_folder(tmp_path, sig, expected_rc):
    """SIGTERM (a scheduler, `kill`) or SIGINT (Ctrl-C) to `probe` while a mode runs: the
    child and its grandchild (its own session, so only the parent got the signal) are
    killed and the temporary folder is gone."""
    env = {**os.environ, "MPDOCTOR_PROBE_FAULT": "no:hang", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "mpdoctor", "probe", "--model", "mlp", "--steps", "2",
                             "--modes", "no"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_probe_processes(str(tmp_path))) < 2:
        time.sleep(0.2)  # the child and its grandchild both started
    started = _probe_processes(str(tmp_path))
    assert len(started) >= 2, started
    assert list(tmp_path.glob("mpdoctor-probe-*"))
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    assert rc == expected_rc, proc.stderr.read()[-2000:]
    time.sleep(0.3)
    assert _probe_processes(str(tmp_path)) == []
    assert list(tmp_path.glob("mpdoctor-probe-*")) == []
    assert b"Traceback" not in proc.stderr.read()
