"""Issue 19 item 6: fixes that fit the case. What a user reads in the fixes of `mpdoctor
explain` (a pasted log) and `mpdoctor run` (a real run on this CPU): the autocast of the
device the log or the run shows, from_pretrained's dtype argument as the transformers seen
spells it, the out-of-memory advice for where the memory was allocated, and the
magnitudes a diverging log printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "fixtures" / "scripts" / "scenarios"
PY = sys.executable

OOM_TAIL = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size}. GPU 0 has a total capacity of "
            "79.10 GiB of which 1.31 GiB is free. Including non-PyTorch memory, this process has 77.78 GiB memory "
            "in use. Of the allocated memory 76.12 GiB is allocated by PyTorch, and 120.91 MiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")
SITE = "/opt/conda/lib/python3.11/site-packages"

ATTENTION_OOM = f"""Traceback (most recent call last):
  File "/home/kim/lm/train.py", line 77, in <module>
    outputs = model(input_ids=batch["input_ids"], labels=batch["labels"])
  File "{SITE}/transformers/models/llama/modeling_llama.py", line 256, in forward
    attn_output, attn_weights = attention_interface(
  File "{SITE}/transformers/models/llama/modeling_llama.py", line 164, in eager_attention_forward
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
""" + OOM_TAIL.format(size="16.00 GiB")

OPTIMIZER_OOM = f"""Traceback (most recent call last):
  File "/workspace/finetune.py", line 112, in <module>
    optimizer.step()
  File "{SITE}/torch/optim/optimizer.py", line 493, in wrapper
    out = func(*args, **kwargs)
  File "{SITE}/torch/optim/adam.py", line 213, in step
    has_complex = self._init_group(
  File "{SITE}/torch/optim/adam.py", line 154, in _init_group
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
""" + OOM_TAIL.format(size="2.50 GiB")

BACKWARD_OOM = f"""Traceback (most recent call last):
  File "/home/u/seg/train.py", line 64, in <module>
    scaler.scale(loss).backward()
  File "{SITE}/torch/_tensor.py", line 648, in backward
    torch.autograd.backward(
  File "{SITE}/torch/autograd/__init__.py", line 353, in backward
    _engine_run_backward(
""" + OOM_TAIL.format(size="3.00 GiB")


def load_oom(version_line: str) -> str:
    return version_line + f"""
Traceback (most recent call last):
  File "/home/u/serve.py", line 12, in <module>
    model = AutoModelForCausalLM.from_pretrained(name, device_map="cuda")
  File "{SITE}/transformers/modeling_utils.py", line 4225, in from_pretrained
    ) = cls._load_pretrained_model(
""" + OOM_TAIL.format(size="172.00 MiB")


def explain(tmp_path: Path, text: str) -> list[dict]:
    log = tmp_path / "pasted.log"
    log.write_text(text, encoding="utf-8")
    p = subprocess.run([PY, "-m", "mpdoctor", "explain", str(log), "--format", "json"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)["findings"]


def finding(findings: list[dict], rule: str) -> dict:
    found = [f for f in findings if f["rule"] == rule]
    assert found, [f["rule"] for f in findings]
    return found[0]


# -- out of memory: the advice for where it allocated -------------------------------------


def test_attention_oom_gets_fused_attention_not_loading_or_zero_advice(tmp_path):
    f = explain(tmp_path, ATTENTION_OOM)[0]
    assert f["rule"] == "cuda-oom"
    assert "allocated in attention (`eager_attention_forward`)" in f["explanation"]
    assert "batch × heads × seq × seq" in f["explanation"]
    assert 'attn_implementation=\\"sdpa\\"' in json.dumps(f["fixes"][0])
    said = " ".join(f["fixes"])
    assert "ZeRO" not in said and "device_map" not in said and "AdamW8bit" not in said


def test_optimizer_oom_gets_optimizer_state_advice(tmp_path):
    f = explain(tmp_path, OPTIMIZER_OOM)[0]
    assert f["rule"] == "cuda-oom"
    assert "optimizer step (`torch/optim/adam.py:154 in _init_group`)" in f["explanation"]
    assert f["fixes"][0].startswith("Make the optimizer state smaller or spread it")
    assert "AdamW8bit" in f["fixes"][0] and "attn_implementation" not in " ".join(f["fixes"])


def test_backward_oom_gets_gradient_checkpointing_first(tmp_path):
    f = explain(tmp_path, BACKWARD_OOM)[0]
    assert "allocated in the backward pass" in f["explanation"]
    assert f["fixes"][0].startswith("Keep fewer activations for the backward pass")
    assert "gradient_checkpointing_enable" in f["fixes"][0]


def test_oom_without_a_site_keeps_the_general_advice(tmp_path):
    f = explain(tmp_path, OOM_TAIL.format(size="2.00 GiB"))[0]
    assert f["rule"] == "cuda-oom"
    assert "allocated in" not in f["explanation"]
    assert f["fixes"][0].startswith("Lower the per-device batch size")


def test_cpu_attention_oom_gets_no_loading_or_zero_advice(tmp_path):
    """The issue's case on the CPU (torch 2.13's own message): 64 x 4096 tokens of eager
    attention, one 128 GiB score buffer."""
    text = ("Traceback (most recent call last):\n"
            '  File "/home/ana/lm/tiny_gpt.py", line 31, in forward\n'
            "    attn_weights = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)\n"
            "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 137438953472 bytes. Error code 12 (Cannot allocate memory)\n")
    f = explain(tmp_path, text)[0]
    assert f["rule"] == "cpu-allocator-oom"
    assert "allocated in attention (`attn_weights = torch.matmul`)" in f["explanation"]
    assert f["fixes"][0].startswith("Use an attention that never materialises the score matrix")
    said = " ".join(f["fixes"])
    assert "ZeRO" not in said and "from_pretrained(..., dtype" not in said and "offload" not in said


def test_run_module_names_the_attention_site(tmp_path):
    """`run` explains a recorded exception with the module the watcher saw raise it
    (diagnosis/run.py hands it in as extra facts): the same site, without a traceback."""
    from mpdoctor.logs import explain_text
    from mpdoctor.rulebase import load

    report = explain_text(OOM_TAIL.format(size="16.00 GiB"), load(),
                          extra_facts={"module": "model.layers.3.self_attn", "module_type": "LlamaAttention",
                                       "step": 0, "phase": "forward", "_run_device": "cuda"})
    f = report.findings[0]
    assert "allocated in attention (`model.layers.3.self_attn`)" in f.explanation
    assert f.fixes[0].startswith("Use an attention that never materialises the score matrix")


# -- from_pretrained's dtype argument as the transformers seen spells it -------------------


def test_load_oom_on_old_transformers_says_torch_dtype(tmp_path):
    f = explain(tmp_path, load_oom("- `transformers` version: 4.44.2"))[0]
    fix = next(x for x in f["fixes"] if "from_pretrained(" in x)
    assert '`from_pretrained(..., torch_dtype=torch.bfloat16, device_map="auto")`' in fix
    assert "before transformers 4.56" not in fix


def test_load_oom_after_the_deprecation_warning_says_dtype(tmp_path):
    f = explain(tmp_path, load_oom("`torch_dtype` is deprecated! Use `dtype` instead!"))[0]
    fix = next(x for x in f["fixes"] if "from_pretrained(" in x)
    assert '`from_pretrained(..., dtype=torch.bfloat16, device_map="auto")`' in fix
    assert "torch_dtype" not in fix


def test_unknown_transformers_says_dtype_and_the_old_spelling(tmp_path):
    text = "[12345.678901] Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:65432100kB\n"
    f = finding(explain(tmp_path, text), "oom-killer")
    fix = next(x for x in f["fixes"] if "from_pretrained(" in x)
    assert ("`from_pretrained(..., dtype=torch.bfloat16, low_cpu_mem_usage=True)` "
            "(`torch_dtype=` before transformers 4.56)") in fix


def test_transformers_5_drops_low_cpu_mem_usage(tmp_path):
    text = ("transformers==5.2.0\n"
            "[12345.678901] Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:65432100kB\n")
    f = finding(explain(tmp_path, text), "oom-killer")
    fix = next(x for x in f["fixes"] if "from_pretrained(" in x)
    assert "`from_pretrained(..., dtype=torch.bfloat16)`;" in fix
    assert "low_cpu_mem_usage" not in fix and "torch_dtype" not in fix


# -- the autocast of the device seen -------------------------------------------------------

ANOMALY = """/home/lee/.venv/lib/python3.11/site-packages/torch/autograd/graph.py:979: UserWarning: Error detected in SqrtBackward0. Traceback of forward call that caused the error:
  File "/home/lee/toy/train.py", line 11, in <module>
    loss = torch.sqrt(out - out.detach().max() - 1).sum()
 (Triggered internally at /__w/pytorch/pytorch/torch/csrc/autograd/python_anomaly_mode.cpp:122.)
Traceback (most recent call last):
  File "/home/lee/toy/train.py", line 13, in <module>
    loss.backward()
RuntimeError: Function 'SqrtBackward0' returned nan values in its 0th output.
"""


@pytest.mark.parametrize("before, spelled", [
    ("Using device: cpu\n", 'torch.autocast("cpu", enabled=False)'),
    ("GPU available: False, used: False\n", 'torch.autocast("cpu", enabled=False)'),
    ("loss tensor(nan, device='cuda:0', grad_fn=<SumBackward0>)\n", 'torch.autocast("cuda", enabled=False)'),
    ("", "torch.autocast(x.device.type, enabled=False)"),
], ids=["device-said-cpu", "lightning-no-gpu", "tensor-on-cuda", "unknown"])
def test_anomaly_fix_names_the_device_seen(tmp_path, before, spelled):
    f = finding(explain(tmp_path, before + ANOMALY), "anomaly-backward-nan")
    fix = next(x for x in f["fixes"] if "autocast(" in x)
    assert spelled in fix
    assert ('"cuda"' in fix) == ("cuda" in spelled)


def test_half_op_on_mps_names_mps_autocast(tmp_path):
    text = 'RuntimeError: "mps_cumsum" not implemented for \'BFloat16\'\n'
    f = explain(tmp_path, text)[0]
    assert f["category"] == "half-op-not-implemented"
    assert any('torch.autocast("mps", dtype=torch.bfloat16)' in x for x in f["fixes"])


# -- the magnitudes a diverging log printed ------------------------------------------------


def test_inf_loss_in_bf16_range_says_divergence_not_precision(tmp_path):
    text = ("step 300 | loss: 2.0113 | grad_norm: 0.8125 | lr: 3.0e-4\n"
            "step 310 | loss: 7.4e+37 | grad_norm: 3.1e+38 | lr: 3.0e-4\n"
            "step 320 | loss: inf | lr: 3.0e-4\n"
            "step 330 | loss: inf | lr: 3.0e-4\n")
    f = finding(explain(tmp_path, text), "logged-loss-nan")
    assert "A finite loss of 7.4e+37 is in the log too: 22% of the largest value bfloat16" in f["explanation"]
    assert "A finite gradient norm of 3.1e+38 is in the log too: 91%" in f["explanation"]
    assert not any(x.startswith("Switch fp16 to bf16") for x in f["fixes"])
    assert f["facts"]["big_loss_bf16"] == "22%"


def test_grad_norm_near_fp16_max_says_how_near(tmp_path):
    text = "".join(f"{{'loss': 2.{i}, 'grad_norm': {g}, 'learning_rate': 4.9e-05, 'epoch': 0.0{i}}}\n"
                   for i, g in enumerate(["1.8125", "61440.0", "inf", "nan", "nan"]))
    f = finding(explain(tmp_path, text), "grad-norm-nan-repeated")
    assert "A finite gradient norm of 61440.0 is in the log too: 94% of float16's largest value (65504)" \
        in f["explanation"]
    assert any(x.startswith("Train in bf16 on Ampere or newer") for x in f["fixes"])


# -- `run`, for real on this CPU -----------------------------------------------------------


def _run(tmp_path: Path, script: str) -> dict:
    report = tmp_path / "report.json"
    subprocess.run([PY, "-m", "mpdoctor", "run", "--report", str(report), "--", PY, str(SCENARIOS / script)],
                   capture_output=True, text=True, timeout=240, cwd=tmp_path)
    return json.loads(report.read_text())


@pytest.mark.slow
def test_run_on_cpu_advises_cpu_autocast(tmp_path):
    pytest.importorskip("torch")
    data = _run(tmp_path, "fit_anomaly_nan_cpu.py")
    f = finding(data["findings"], "anomaly-backward-nan")
    said = " ".join(f["fixes"])
    assert 'torch.autocast("cpu", enabled=False)' in said
    assert '"cuda"' not in said


@pytest.mark.slow
def test_run_spells_dtype_for_the_installed_transformers(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    data = _run(tmp_path, "fit_half_qr_cpu.py")
    f = data["findings"][0]
    assert f["rule"] == "half-op-not-implemented-cpu"
    fix = next(x for x in f["fixes"] if "from_pretrained(" in x)
    want = "dtype=torch.float32" if (major, minor) >= (4, 56) else "torch_dtype=torch.float32"
    assert f"`from_pretrained(..., {want})`" in fix
    assert "before transformers 4.56" not in fix  # the version is known: no hedge
