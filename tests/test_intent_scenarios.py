"""Issue 19 item 3, live: the precision intent scenarios of fixtures/scripts/scenarios/
run for real under `mpdoctor run` on the CPU (accelerate launch with a config file and a
flag, the environment, a Trainer), and the faces asked the same question about this
machine (fp8 on a CPU; a MULTI_GPU config without CUDA) answering alike."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what this machine without a GPU gets")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "fixtures" / "scripts" / "scenarios"
PY = sys.executable
ACCELERATE = shutil.which("accelerate", path=os.path.dirname(PY)) or "accelerate"


def _env(**extra: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NO_COLOR="1", **extra)
    if "ACCELERATE_MIXED_PRECISION" not in extra:
        env.pop("ACCELERATE_MIXED_PRECISION", None)
    return env


def run(tmp_path: Path, *cmd: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    p = subprocess.run([PY, "-m", "mpdoctor", "run", "--report", str(report), "--", *cmd], capture_output=True,
                       text=True, timeout=240, cwd=tmp_path, env=_env(**env))
    return p, json.loads(report.read_text())


def mpdoctor(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "mpdoctor", *args], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=_env(**env))


def launch(*args: str) -> list[str]:
    return [ACCELERATE, "launch", *args]


def rules(data: dict) -> list[str]:
    return [f["rule"] for f in data["findings"]]


def test_config_bf16_with_code_no_trains_fp32_and_says_which_won(tmp_path):
    p, data = run(tmp_path, *launch("--config_file", str(SCENARIOS / "intent_bf16_config.yaml"),
                                    str(SCENARIOS / "intent_code_says_no.py")))
    assert p.returncode == 0
    assert "CHECK accelerator.mixed_precision='no' ACCELERATE_MIXED_PRECISION='bf16'" in p.stdout
    top = data["findings"][0]
    assert top["rule"] == "intent-code-overrides" and top["category"] == "accelerate-config"
    assert (top["facts"]["trained"], top["facts"]["asked"]) == ("fp32", "bf16")
    assert "intent_code_says_no.py:19" in top["title"] and "intent_bf16_config.yaml" in top["title"]
    sources = data["precision_plan"]["sources"]
    assert [(s["source"], s["value"]) for s in sources] == [("config_file", "bf16"), ("accelerator_arg", "no")]


def test_config_bf16_with_plain_accelerator_is_applied(tmp_path):
    p, data = run(tmp_path, *launch("--config_file", str(SCENARIOS / "intent_bf16_config.yaml"),
                                    str(SCENARIOS / "intent_plain_accelerator.py")))
    assert p.returncode == 0 and "CHECK accelerator.mixed_precision='bf16'" in p.stdout
    assert not any(r.startswith("intent-") for r in rules(data))
    assert data["precision_plan"]["autocast_dtype"] == "bfloat16"


def test_launch_flag_over_config_is_said_as_a_note(tmp_path):
    p, data = run(tmp_path, *launch("--mixed_precision", "bf16", "--config_file",
                                    str(SCENARIOS / "intent_fp16_config.yaml"), str(SCENARIOS / "intent_plain_accelerator.py")))
    assert p.returncode == 0 and "CHECK accelerator.mixed_precision='bf16'" in p.stdout
    f = next(f for f in data["findings"] if f["rule"] == "intent-flag-overrides-config")
    assert f["severity"] == "info"
    assert f["title"] == ("`accelerate launch --mixed_precision bf16` overrode the config file's fp16: "
                          "the run trained in bf16")
    assert not any(f["severity"] == "error" for f in data["findings"])


def test_env_fp16_with_trainer_bf16(tmp_path):
    p, data = run(tmp_path, PY, str(SCENARIOS / "intent_env_fp16_trainer_bf16.py"), ACCELERATE_MIXED_PRECISION="fp16")
    assert p.returncode == 0 and "CHECK env='fp16' accelerator.mixed_precision='bf16'" in p.stdout
    top = data["findings"][0]
    assert top["rule"] == "intent-code-overrides"
    assert top["title"] == ("TrainingArguments(bf16=True) overrode ACCELERATE_MIXED_PRECISION=fp16: "
                            "the run trained in bf16, not fp32")


def test_env_fp16_with_trainer_bf16_the_callback_says_the_same(tmp_path):
    p = subprocess.run([PY, str(SCENARIOS / "intent_env_fp16_trainer_bf16.py"), "callback"], capture_output=True,
                       text=True, timeout=240, cwd=tmp_path, env=_env(ACCELERATE_MIXED_PRECISION="fp16"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert ("mpdoctor: warning [intent-code-overrides] accelerate-config: TrainingArguments(bf16=True) overrode "
            "ACCELERATE_MIXED_PRECISION=fp16: the run trained in bf16, not fp32") in p.stderr


# --- fp8 on this CPU: check, run and explain --here give one answer ------------------------------

FP8_SCRIPT = "from accelerate import Accelerator\nAccelerator()\n"


def _fp8_fixes_fit(fixes: list[str]) -> None:
    assert fixes[0].startswith("Train in bf16, which runs on this machine")
    assert not any("pip install torchao" in x for x in fixes)
    assert not any("fp16" in x for x in fixes)


@cpu_only
def test_fp8_on_cpu_check_run_and_explain_here_agree(tmp_path):
    rc = mpdoctor(tmp_path, "check", "--mixed-precision", "fp8", "--format", "json")
    check = json.loads(rc.stdout)
    f = next(f for f in check["findings"] if f["rule"] == "fp8-below-sm89")
    _fp8_fixes_fit(f["fixes"])
    assert check["precision_plan"]["effective"] is None

    (tmp_path / "train.py").write_text(FP8_SCRIPT)
    p, data = run(tmp_path, PY, "train.py", ACCELERATE_MIXED_PRECISION="fp8")
    assert p.returncode == 1 and "requires `transformer_engine` or `torchao`" in p.stderr
    top = data["findings"][0]
    assert top["rule"] == "fp8-below-sm89"
    _fp8_fixes_fit(top["fixes"])

    log = tmp_path / "fp8.log"
    log.write_text(p.stderr)
    here = json.loads(mpdoctor(tmp_path, "explain", "--here", str(log), "--format", "json").stdout)
    first = here["findings"][0]
    assert first["category"] == "fp8-unsupported"
    _fp8_fixes_fit(first["fixes"])


@cpu_only
def test_fp8_asked_in_code_on_cpu_run_says_what_check_says(tmp_path):
    # Accelerator(mixed_precision="fp8") raises in its __init__ (no backend): the plan never
    # saw it, the failure names the precision, and the env rules judge that, as check does
    (tmp_path / "train.py").write_text('from accelerate import Accelerator\nAccelerator(mixed_precision="fp8")\n')
    p, data = run(tmp_path, PY, "train.py")
    assert p.returncode == 1
    top = data["findings"][0]
    assert top["rule"] == "fp8-below-sm89"
    _fp8_fixes_fit(top["fixes"])


# --- a MULTI_GPU config for 2 processes on this machine without CUDA -----------------------------

@cpu_only
def test_multi_gpu_config_without_cuda_check_says_it(tmp_path):
    cfg = tmp_path / "multi.yaml"
    cfg.write_text('compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: "no"\n'
                   "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nuse_cpu: false\n")
    p = mpdoctor(tmp_path, "check", "--config-file", str(cfg), "--format", "json")
    assert p.returncode == 1
    f = next(f for f in json.loads(p.stdout)["findings"] if f["rule"] == "multi-gpu-config-no-cuda")
    assert f["severity"] == "error"
    assert "each would train alone" in f["title"]


def test_env_fp16_with_lightning_bf16_is_not_read_as_the_intent(tmp_path):
    # Lightning never reads ACCELERATE_MIXED_PRECISION: its precision= trained (bf16), and
    # no finding may say "fp16 asked for, trained in fp32"
    p, data = run(tmp_path, PY, str(SCENARIOS / "intent_env_fp16_lightning_bf16.py"), ACCELERATE_MIXED_PRECISION="fp16")
    assert p.returncode == 0 and "CHECK precision 'bf16-mixed', ACCELERATE_MIXED_PRECISION='fp16'" in p.stdout
    assert not any(f["severity"] in ("error", "warning") for f in data["findings"]), rules(data)
    assert data["precision_plan"]["requested"] is None
    assert data["precision_plan"]["autocast_dtype"] == "bfloat16"
