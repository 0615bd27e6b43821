"""`mpdoctor run` over the real training scripts in fixtures/scripts/, torch on the CPU.

Each test runs one real child (about 2-3 s of torch import); what is asserted is what a
user reads: the exit status, their own output untouched, and the findings in --report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "scripts"
PY = sys.executable


def wrapped(script: str, tmp_path: Path, *extra: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    p = subprocess.run([PY, "-m", "mpdoctor", "run", "--report", str(report), *extra, "--", PY, str(SCRIPTS / script)],
                       capture_output=True, timeout=120, cwd=tmp_path, env=env)
    return p, json.loads(report.read_text())


def by_rule(data: dict, rule: str) -> dict:
    hits = [f for f in data["findings"] if f["rule"] == rule]
    assert hits, f"no {rule} in {[f['rule'] for f in data['findings']]}"
    return hits[0]


def errors(data: dict) -> list[dict]:
    return [f for f in data["findings"] if f["severity"] == "error"]


def test_fp16_overflow_is_localised_to_the_layer_forward_and_step(tmp_path: Path) -> None:
    p, data = wrapped("fp16_overflow.py", tmp_path)
    assert p.returncode == data["exit_code"] == 1
    assert p.stdout.endswith(b"Loss is nan, stopping training\n")
    top = errors(data)[0]
    assert top["category"] == "non-finite-values"
    facts = top["facts"]
    assert (facts["module"], facts["phase"], facts["step"], facts["dtype"], facts["what"]) == \
        ("blocks.2.proj", "forward", 3, "float16", "Inf")
    assert top["rule"] == "nonfinite-made-in-forward"  # a finite input: the layer made it
    warn = by_rule(data, "activation-near-fp16-limit")
    assert warn["severity"] == "warning" and warn["category"] == "fp16-value-overflow"
    assert (warn["facts"]["module"], warn["facts"]["step"], warn["facts"]["absmax"]) == ("blocks.2.proj", 2, "40000")
    plan = data["precision_plan"]
    assert plan["autocast_dtype"] == "float16" and plan["grad_scaler"] is True
    # the child's output first, our diagnosis after it, on stderr
    assert b"blocks.2.proj" in p.stderr and b"blocks.2.proj" not in p.stdout


def test_dtype_mismatch_names_the_halved_submodule(tmp_path: Path) -> None:
    p, data = wrapped("dtype_mismatch.py", tmp_path)
    assert p.returncode == 1
    top = data["findings"][0]
    assert top["category"] == "dtype-mismatch"
    assert top["facts"]["module"] == "head" and top["facts"]["step"] == 0
    # the log rule explains the message; the instrumentation's context says where
    assert top["facts"]["param_dtypes"] == "2× float16@cpu"
    assert top["facts"]["input_dtypes"].startswith("float32 cpu")
    assert top["facts"]["autocast"] == "off"
    assert len([f for f in data["findings"] if f["rule"] == top["rule"]]) == 1  # the log and the run: one finding
    assert not [f for f in data["findings"] if f["rule"] == "instrumentation-stopped"]


def test_nan_only_in_backward_is_found_in_the_backward_of_its_module(tmp_path: Path) -> None:
    p, data = wrapped("nan_backward.py", tmp_path)
    assert p.returncode == 0  # the script does not notice
    top = errors(data)[0]
    assert (top["facts"]["module"], top["facts"]["phase"], top["facts"]["step"]) == ("blocks.1.dist", "backward", 0)
    assert top["rule"] == "nonfinite-made-in-backward"
    # the forward only goes non-finite one step later, through the NaN'd weights: evidence, not a cause
    assert any("then blocks.0 · forward · step 1" in e["text"] for e in top["evidence"])
    assert top["facts"]["steps_affected"] == 2


def test_host_allocation_failure_gets_module_and_host_memory(tmp_path: Path) -> None:
    p, data = wrapped("host_oom.py", tmp_path)
    assert p.returncode == 1
    top = data["findings"][0]
    assert top["category"] == "host-out-of-memory"
    assert top["facts"]["module"] == "attn"
    assert "process RSS" in top["facts"]["memory_context"]  # the memory when it raised


def test_exit_0_with_nan_loss_is_still_reported(tmp_path: Path) -> None:
    p, data = wrapped("nan_loss_exit0.py", tmp_path)
    assert p.returncode == data["exit_code"] == 0
    assert p.stdout.endswith(b"step 3 loss nan\ndone\n")
    top = errors(data)[0]
    assert (top["facts"]["module"], top["facts"]["phase"], top["facts"]["step"]) == ("pool", "forward", 2)
    assert b"`pool`" in p.stderr and b"step 2" in p.stderr


def test_clean_run_identical_output_no_error_findings(tmp_path: Path) -> None:
    bare = subprocess.run([PY, str(SCRIPTS / "clean_train.py")], capture_output=True, timeout=120, cwd=tmp_path)
    p, data = wrapped("clean_train.py", tmp_path)
    assert p.returncode == bare.returncode == 0
    assert p.stdout == bare.stdout and p.stderr == bare.stderr
    assert data["findings"] == []
    assert data["precision_plan"]["autocast_dtype"] == "bfloat16"
    assert data["precision_plan"]["autocast_enabled"] is True


def test_instrumentation_failing_changes_nothing_and_is_reported(tmp_path: Path) -> None:
    bare = subprocess.run([PY, str(SCRIPTS / "nan_loss_exit0.py")], capture_output=True, timeout=120, cwd=tmp_path)
    env = dict(os.environ, MPDOCTOR_INSTRUMENT_FAIL="1")
    p, data = wrapped("nan_loss_exit0.py", tmp_path, env=env)
    assert p.returncode == bare.returncode == 0
    assert p.stdout == bare.stdout
    # the instrumentation stood aside; the run is still diagnosed from its output
    assert p.stderr.startswith(bare.stderr)
    assert by_rule(data, "logged-loss-nan")["severity"] == "error"
    info = by_rule(data, "instrumentation-stopped")
    assert info["severity"] == "info" and "MPDOCTOR_INSTRUMENT_FAIL" in info["evidence"][0]["text"]


def test_cuda_oom_context_from_the_allocator_figures() -> None:
    """The OOM context a child reads on CUDA (memory_stats, mem_get_info, the snapshot's
    blocks attributed to the watched tensors), through a recorded fixture and the same
    code path, into the finding a user reads."""
    from mpdoctor import rulebase
    from mpdoctor.diagnosis.run import judge_run
    from mpdoctor.instrument.context import summarise_device_memory

    rec = json.loads((ROOT / "fixtures" / "events" / "cuda-oom-allocator.json").read_text())
    dev = summarise_device_memory(rec["raw"], [tuple(o) for o in rec["owners"]])
    assert (dev["allocated"], dev["reserved"], dev["reserved_unused"], dev["free"], dev["total"]) == \
        ("18.81 GiB", "22.06 GiB", "3.25 GiB", "1.12 GiB", "23.65 GiB")
    assert dev["num_alloc_retries"] == 3 and dev["num_ooms"] == 1 and "CUDA OOMs: 1" in dev["summary"]
    assert dev["largest_allocations"][:3] == ["4.00 GiB (output of blocks.3.mlp.fc1)",
                                              "3.00 GiB (output of blocks.2.mlp.fc1)",
                                              "2.50 GiB (output of lm_head)"]
    assert [m["owner"] for m in dev["largest_by_module"]][:2] == ["output of blocks.3.mlp.fc1",
                                                                  "output of blocks.2.mlp.fc1"]
    evidence = json.loads((ROOT / "fixtures" / "events" / "host-oom-cpu-allocator.json").read_text())
    proc = evidence["processes"][0]
    err = proc["watch"]["errors"][0]
    err.update(exception=rec["exception"], module="blocks.3.mlp.fc1", module_type="Linear")
    err["context"]["memory"]["device"] = dev
    proc["exceptions"] = [{"type": "exception", "time": err["time"], "step": 0, "module": err["module"],
                           "exception": rec["exception"]}]
    top = judge_run(evidence, rulebase.load()).findings[0]
    assert top.category == "out-of-memory"
    words = top.facts["memory_context"]
    assert "device cuda:0: allocated 18.81 GiB, reserved 22.06 GiB" in words
    assert "largest allocations 4.00 GiB (output of blocks.3.mlp.fc1)" in words


def test_the_watcher_names_the_tensors_that_hold_memory() -> None:
    """What the OOM context attributes the allocator's blocks to, live on the CPU."""
    import torch
    from torch import nn

    import mpdoctor
    from mpdoctor.instrument.context import attribute_blocks

    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    seen: list = []
    with mpdoctor.watch(net) as h:
        net[2].register_forward_hook(lambda m, a, o: seen.append(h.memory_owners()))
        net(torch.randn(32, 64)).sum().backward()
        net(torch.randn(32, 64))  # the second step: the gradients of the first are alive
    labels = {label for label, _, _ in seen[-1]}
    # the output of 0 was freed (ReLU keeps its own output for the backward, not its input)
    assert {"parameters of 0", "gradients of 0", "output of 1", "input of Sequential"} <= labels
    assert "output of 0" not in labels
    by_owner = {m["owner"]: m["bytes"] for m in attribute_blocks([], seen[-1])}
    assert by_owner["output of 1"] == 32 * 256 * 4 and by_owner["parameters of 0"] == (64 * 256 + 256) * 4


@pytest.mark.slow
def test_watch_every_reaches_the_wrapped_child(tmp_path: Path) -> None:
    """MPDOCTOR_WATCH_EVERY=3 under `mpdoctor run`: steps 0 and 3 are watched; the Inf
    of step 3 is still localised, the hot step 2 (not sampled) is not looked at."""
    env = dict(os.environ, MPDOCTOR_WATCH_EVERY="3")
    p, data = wrapped("fp16_overflow.py", tmp_path, env=env)
    assert p.returncode == 1
    facts = errors(data)[0]["facts"]
    assert (facts["module"], facts["phase"], facts["step"]) == ("blocks.2.proj", "forward", 3)
    assert "activation-near-fp16-limit" not in [f["rule"] for f in data["findings"]]
