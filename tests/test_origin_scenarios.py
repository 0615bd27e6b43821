"""Issue 19 item 2, live: each scenario script (fixtures/scripts/scenarios/) run for real
under `mpdoctor run` on the CPU; the report's first finding names the odd tensor, what made
it, and a first fix that changes that tensor or its maker, fitted to this CPU bf16 run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "fixtures" / "scripts" / "scenarios"


def run(tmp_path: Path, name: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", NO_COLOR="1")
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable,
                        str(SCENARIOS / name)], capture_output=True, timeout=240, cwd=tmp_path, env=env)
    return p, json.loads(report.read_text())


# script -> (rule, category, odd tensor, words of the first fix)
CASES = {
    "float64_class_weight_bf16.py": ("matmul-operands-dtype", "dtype-mismatch", "class_cost",
                                     ["`class_cost`", "float64_class_weight_bf16.py:35", "float32"]),
    "frozen_teacher_distill.py": ("matmul-operands-dtype", "dtype-mismatch", "t_feat",
                                  ["`teacher.float()`", "frozen_teacher_distill.py:71"]),
    "double_target_huber.py": ("dtype-mismatch-in-backward", "dtype-mismatch", "y",
                               ["`y`", "double_target_huber.py:32", ".float()"]),
    "trainer_bf16_half_model.py": ("mixed-dtype-cpu", "dtype-mismatch",
                                   "bert.encoder.layer.0.attention.output.LayerNorm.weight", ["`model.float()`"]),
    "custom_function_fp32_bf16.py": ("index-put-source-dtype", "dtype-mismatch", "gated",
                                     ["`SafeGate.forward`", "`return out.to(x.dtype)`"]),
    "double_cast_in_forward.py": ("matmul-operands-dtype", "dtype-mismatch", "scores",
                                  ["`.double()`", "double_cast_in_forward.py:34"]),
    "meta_buffer_device.py": ("tensors-on-different-devices", "device-mismatch", "encoder.pos_scale",
                              ["`encoder.pos_scale`", "cpu"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_first_finding_names_the_odd_tensor_and_what_made_it(tmp_path, name) -> None:
    rule, category, tensor, words = CASES[name]
    p, data = run(tmp_path, name)
    assert p.returncode == 1, p.stderr[-2000:]
    f = data["findings"][0]
    assert (f["rule"], f["category"]) == (rule, category)
    assert f["facts"]["odd_tensor"] == tensor
    for w in words:
        assert w in f["fixes"][0], (w, f["fixes"][0])
    said = " ".join([f["title"], f["explanation"], *f["fixes"]])
    assert 'torch.autocast("cuda"' not in said and "model.to(torch.float16)" not in said


def test_a_half_head_names_the_weight_the_optimizer_broke(tmp_path) -> None:
    p, data = run(tmp_path, "half_head_bf16_nan.py")
    f = data["findings"][0]
    assert f["rule"] == "half-params-updated-directly"
    assert (f["facts"]["odd_tensor"], f["facts"]["odd_dtype"]) == ("head.weight", "float16")
    assert "`head.weight` (float16) already held NaN" in f["explanation"]
