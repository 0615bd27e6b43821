"""The everyday mistakes of issue 8, each a real script (fixtures/scripts/scenarios/)
run for real under `mpdoctor run` on the CPU: the root cause comes first, with the fix
that fits this machine. What a user reads is asserted: the report's first finding, its
facts, and the words on the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mpdoctor

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "fixtures" / "scripts" / "scenarios"
PY = sys.executable


def run(tmp_path: Path, *cmd: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    full = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NO_COLOR="1", **(env or {}))
    p = subprocess.run([PY, "-m", "mpdoctor", "run", "--report", str(report), "--", *cmd], capture_output=True,
                       timeout=240, cwd=tmp_path, env=full)
    return p, json.loads(report.read_text())


def script(name: str) -> list[str]:
    return [PY, str(SCENARIOS / name)]


def launch2(name: str) -> list[str]:
    from tests.test_run_accelerate import free_port

    port = free_port()
    accelerate = shutil.which("accelerate", path=os.path.dirname(PY)) or "accelerate"
    return [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--main_process_port", str(port), str(SCENARIOS / name)]


def top(data: dict) -> dict:
    assert data["findings"], "no finding at all"
    return data["findings"][0]


# mpdoctor's own package folder (a checkout named `mpdoctor` has /mpdoctor/ in every path)
PACKAGE = os.path.dirname(os.path.realpath(mpdoctor.__file__)) + os.sep


def no_mpdoctor_frames(data: dict) -> None:
    for f in data["findings"]:
        assert not str(f["facts"].get("user_frame", "")).startswith(PACKAGE), f
        for e in f["evidence"]:
            assert "user code: " not in e["text"] or PACKAGE not in e["text"], e


@pytest.mark.parametrize("name", ["trainer_fp16_cpu.py", "accelerate_fp16_cpu_flag.py"])
def test_fp16_on_a_cpu_is_the_device_not_the_model_call(tmp_path, name):
    p, data = run(tmp_path, *script(name))
    f = top(data)
    assert (f["rule"], f["category"], f["severity"]) == ("fp16-silently-fp32-on-cpu", "fp16-unsupported-device", "error")
    assert f["facts"]["observed_dtype"] == "float32"
    assert any("bf16" in fix for fix in f["fixes"])  # what fits this machine
    assert "precision-not-applied" not in [x["rule"] for x in data["findings"]]
    assert b"fp16 asked for, but the run trained on the CPU in plain fp32" in p.stderr


@pytest.mark.parametrize("name", ["half_head_bf16_nan.py", "model_to_fp16_sgd_nan.py", "lightning_16true_cpu.py"])
def test_float16_weights_updated_by_adam_are_named_as_the_cause_of_the_nan(tmp_path, name):
    p, data = run(tmp_path, *script(name))
    f = top(data)
    assert (f["rule"], f["category"]) == ("half-params-updated-directly", "non-finite-values")
    assert f["facts"]["master_weights"] == "none" and f["facts"]["step"] >= 1
    assert any("float32" in fix and ("model.float()" in fix or ".half()" in fix) for fix in f["fixes"])


def test_a_float64_tensor_in_a_custom_loss_is_a_dtype_mismatch(tmp_path):
    p, data = run(tmp_path, *script("float64_class_weight_bf16.py"))
    assert p.returncode == 1
    f = top(data)
    assert f["category"] == "dtype-mismatch"
    assert "float64" in f["title"]
    # autocast is on here and never casts float64: the first fix is at the tensor's source
    assert "torch.from_numpy(x).float()" in f["fixes"][0]
    assert not data["unrecognised"]


def test_processes_that_never_joined_are_two_trainings(tmp_path):
    p, data = run(tmp_path, *launch2("two_ranks_default_accelerator.py"))
    assert p.returncode == 0
    f = top(data)
    assert (f["rule"], f["severity"]) == ("processes-did-not-join", "error")
    assert f["facts"]["world_size"] == 2
    assert any("Accelerator(cpu=True)" in fix for fix in f["fixes"])
    assert b"each one trained alone" in p.stderr  # said on the terminal, not only in the JSON


def test_a_ddp_script_without_a_process_group(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(PY)) or "torchrun"
    from tests.test_run_accelerate import free_port

    p, data = run(tmp_path, torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                  str(SCENARIOS / "torchrun_two_no_pg.py"))
    assert p.returncode != 0
    assert top(data)["rule"] == "process-group-not-initialized"
    # both ranks raised it: one finding for the cause, seen on two ranks
    assert [x["rule"] for x in data["findings"]].count("process-group-not-initialized") == 1


def test_lightning_fp16_fallback_is_said_by_run_as_by_explain(tmp_path):
    p, data = run(tmp_path, *script("lightning_16mixed_cpu.py"))
    assert p.returncode == 0
    rules = [f["rule"] for f in data["findings"]]
    assert "lightning-fp16-cpu-fallback" in rules
    assert b"Lightning switched fp16 mixed precision to bf16" in p.stderr
    assert data["precision_plan"]["autocast_dtype"] == "bfloat16"


def test_an_upper_case_precision_is_named_as_ignored_by_run_and_by_check(tmp_path):
    p, data = run(tmp_path, *script("env_upper_bf16.py"), env={"ACCELERATE_MIXED_PRECISION": "BF16"})
    f = top(data)
    assert (f["rule"], f["facts"]["value"], f["facts"]["meant"]) == ("mixed-precision-unknown-value", "BF16", "bf16")
    assert f["facts"]["observed_dtype"] == "float32"
    # check, on the same machine and variable (no accelerate config file: HF_HOME is empty)
    env = dict(os.environ, ACCELERATE_MIXED_PRECISION="BF16", HF_HOME=str(tmp_path / "hf"))
    c = subprocess.run([PY, "-m", "mpdoctor", "check", "--format", "json"], capture_output=True, timeout=120,
                       cwd=tmp_path, env=env)
    check = json.loads(c.stdout)
    assert "mixed-precision-unknown-value" in [x["rule"] for x in check["findings"]]
    assert check["precision_plan"]["under_python"] == "BF16"
    assert check["precision_plan"]["effective"] == "fp32"


def test_only_trained_modules_make_the_plan_and_mpdoctor_is_never_user_code(tmp_path):
    p, data = run(tmp_path, *script("frozen_teacher_distill.py"))
    f = top(data)
    assert (f["category"], f["facts"]["module"]) == ("dtype-mismatch", "fuse")
    assert "`teacher.float()`" in f["fixes"][0]  # the float64 teacher is the source, by its name
    plan = data["precision_plan"]
    assert plan["params"]["trainable"] == {"float32": 4804}  # the student, not the frozen teacher
    assert plan["autocast_dtype"] == "bfloat16"              # the student's first matmul
    assert "precision-not-applied" not in [x["rule"] for x in data["findings"]]
    no_mpdoctor_frames(data)
    p, data = run(tmp_path, *script("double_target_huber.py"))
    assert top(data)["category"] == "dtype-mismatch"
    no_mpdoctor_frames(data)


def test_lightnings_cpu_banner_is_a_choice_not_a_finding(tmp_path):
    # issue 19 item 4: `GPU available: False, used: False` on a machine without a GPU is
    # Lightning stating the accelerator it chose; the run trains fine and nothing is said
    p, data = run(tmp_path, *script("lightning_cpu_banner_clean.py"))
    assert p.returncode == 0
    assert b"GPU available: False, used: False" in p.stdout + p.stderr  # the banner passed through
    assert [f["rule"] for f in data["findings"] if f["severity"] in ("error", "warning")] == []
    assert "cuda-unavailable" not in [f["category"] for f in data["findings"]]
