"""`mpdoctor probe --model SPEC`: the user's own model, each SPEC form, for real.

Real children, real torch on the CPU, real small models: a GPT-2 built from a
config.json, a factory file, a module:factory on the path, a model that overflows
fp16, and --max-batch under a memory cap checked against sizes tried directly.
Kept lean: few steps, two modes at most per run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "fixtures" / "probe" / "models"
LIVE = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("accelerate") is not None
live = pytest.mark.skipif(not LIVE, reason="torch and accelerate are needed for live probe runs")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _probe(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpdoctor", "probe", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=timeout)


def _json(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    return json.loads(out.stdout)


def _mode(data: dict, name: str) -> dict:
    return next(m for m in data["modes"] if m["mode"] == name)


# -- a transformers config.json ------------------------------------------------------

@live
@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is needed for a config.json")
def test_transformers_config_is_built_and_probed(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}))
    # HF_HUB_OFFLINE is forced in the child: an unreachable endpoint changes nothing
    data = _json(_probe("--model", str(cfg), "--modes", "no,bf16", "--steps", "3", "--seq-len", "16",
                        "--format", "json", env={"HF_ENDPOINT": "http://127.0.0.1:9"}))
    w = data["workload"]
    assert w["model"] == "LlamaForCausalLM" and w["parameters"] > 100_000
    assert w["batch"] == "random input_ids (8, 16) in [0, 256) with an all-ones attention_mask, labels = input_ids"
    assert w["loss"] == "the model output's .loss"
    no, bf16 = _mode(data, "no"), _mode(data, "bf16")
    assert no["ok"] and no["autocast_dtype"] == "float32" and no["speedup"] == 1.0
    assert bf16["ok"] and bf16["autocast_dtype"] == "bfloat16" and bf16["speedup"] > 0
    # same seed, same batch: bf16 near fp32 but not on it
    assert 0 < bf16["loss_rel_diff"] < 0.05 and 0 < bf16["logits_rel_diff"] < 0.1
    assert no["peak_memory_bytes"] > 0 and no["max_rss_bytes"] > no["peak_memory_bytes"]
    # headroom names the model's own modules, largest |output| first
    names = [h["module"] for h in bf16["headroom"]]
    assert names and all(n.startswith(("model.", "lm_head")) for n in names)
    assert bf16["headroom"][0]["dtype"] in ("bfloat16", "float32") and bf16["headroom"][0]["headroom"] > 1e30
    assert no["fp16_headroom"][0]["fp16_headroom"] > 10  # a fresh model is far from fp16's limit
    assert data["recommendation"]["config"]["accelerate_config"].startswith("mixed_precision: ")


# -- factory files and modules ----------------------------------------------------------

FACTORIES = '''
import torch
from torch import nn

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

def triple():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    batch = (torch.randn(6, 8), torch.randint(0, 3, (6,)))

    class WithTarget(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model
        def forward(self, x, y):
            return self.net(x)

    return WithTarget(), batch, lambda out, b: nn.functional.cross_entropy(out.float(), b[1])

def not_a_model():
    return 42
'''


@live
@pytest.mark.slow
def test_factory_file_with_the_default_name(tmp_path):
    (tmp_path / "mymodels.py").write_text(FACTORIES)
    data = _json(_probe("--model", str(tmp_path / "mymodels.py"), "--modes", "no", "--steps", "2",
                        "--batch-size", "5", "--format", "json"))
    w = data["workload"]
    assert (w["model"], w["factory"], w["parameters"]) == ("Sequential", "make_model", 16 * 32 + 32 + 32 * 4 + 4)
    assert w["batch"] == "standard normal float32 of shape (batch, 16) for input (from the first Linear)"
    assert w["batch_size"] == 5
    assert w["loss"] == "mean of squares of the output (the model gives no loss)"
    assert _mode(data, "no")["ok"]


@live
@pytest.mark.slow
def test_module_factory_on_the_path_with_batch_and_loss(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(FACTORIES)
    out = _probe("--model", "mypkg.models:triple", "--modes", "no", "--steps", "2", "--format", "markdown",
                 cwd=tmp_path)  # importable from the current directory, as with `python -m`
    assert out.returncode == 0, out.stderr
    assert "| no | ✓ |" in out.stdout
    assert "Model: WithTarget from mypkg.models:triple (" in out.stdout
    assert "Batch: the factory's batch (float32 (6, 8), int64 (6,)); loss: the factory's loss_fn" in out.stdout


@live
@pytest.mark.slow
def test_a_factory_that_gives_no_model_is_exit_2(tmp_path):
    (tmp_path / "mymodels.py").write_text(FACTORIES)
    out = _probe("--model", f"{tmp_path / 'mymodels.py'}:not_a_model", "--modes", "no,bf16", "--steps", "2")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().endswith(
        "not_a_model() returned int, not a torch.nn.Module (or (model, batch[, loss_fn]))")
    assert "Traceback" not in out.stderr.split("mpdoctor: ")[-1]


@pytest.mark.parametrize("spec, words", [
    ("nope.py:make", "no such file 'nope.py'"),
    ("no_such_module_xyz:make", "no module named 'no_such_module_xyz'"),
    ("pkg.mod:not-a-name", "is not a function name"),
    ("resnet", "not a built-in model"),
])
def test_a_wrong_spec_is_exit_2_before_any_child(spec, words):
    out = _probe("--model", spec)
    assert out.returncode == 2 and words in out.stderr and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_json_that_is_no_config_is_exit_2(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 3}')
    out = _probe("--model", str(bad))
    assert out.returncode == 2 and "not a transformers config" in out.stderr
    bad.write_text("{nope")
    out = _probe("--model", str(bad))
    assert out.returncode == 2 and "not a JSON file" in out.stderr


@pytest.mark.parametrize("args, words", [
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, not nan"),
    (["--timeout", "inf"], "--timeout must be a positive number of seconds, not inf"),
    (["--timeout", "-1"], "--timeout must be a positive number of seconds"),
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
    (["--model", "fixtures/probe/models/hot.py:near_limit", "--stress"], "--stress applies to the built-in models"),
])
def test_bad_numbers_are_exit_2(args, words):
    out = _probe(*args, timeout=30)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr


# -- overflow --------------------------------------------------------------------------

@live
@pytest.mark.slow
def test_a_model_that_overflows_fp16_names_the_module():
    data = _json(_probe("--model", f"{MODELS / 'hot.py'}:overflowing", "--modes", "no,fp16", "--steps", "3",
                        "--format", "json"))
    no, fp16 = _mode(data, "no"), _mode(data, "fp16")
    # fp32 holds it: its largest |output| is ~3e5, 0.2x of fp16's largest value
    top = no["fp16_headroom"][0]
    assert (top["module"], top["type"]) == ("2", "Scale") and top["absmax"] > 65504 and top["fp16_headroom"] < 1
    assert no["nonfinite_count"] == 0
    # accelerate's fp16 ran fp32 on this CPU: what fp16 would have to hold is named
    f = next(f for f in fp16["findings"] if f["rule"] == "module-near-fp16-overflow")
    assert f["title"].startswith("fp16 would overflow: 2 (Scale) reaches 3.0")
    assert "these are float32 values" in f["explanation"]
    assert "the first non-finite output comes from 2" in f["explanation"]  # torch's own fp16 autocast


@live
@pytest.mark.slow
def test_fp16_that_really_runs_names_the_first_nonfinite_module():
    """fp16 as on a GPU (torch's fp16 autocast and a GradScaler, MPDOCTOR_PROBE_FAULT=torch-fp16)."""
    data = _json(_probe("--model", f"{MODELS / 'hot.py'}:overflowing", "--modes", "fp16", "--steps", "3",
                        "--format", "json", env={"MPDOCTOR_PROBE_FAULT": "fp16:torch-fp16+nowatch"}))
    fp16 = _mode(data, "fp16")
    assert fp16["autocast_dtype"] == "float16" and fp16["nonfinite_count"] > 0
    assert fp16["first_nonfinite_module"]["module"] == "2"
    f = next(f for f in fp16["findings"] if f["rule"] == "mode-overflowed-fp16")
    assert "The first non-finite output came from 2 (Scale, float16) in the fixed-batch evaluation." in f["explanation"]
    assert data["recommendation"]["mode"] != "fp16"


# -- --max-batch -------------------------------------------------------------------------

TRY_SIZES = r'''
import gc, resource, sys
cap, folder, sizes = int(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
import torch
from accelerate import Accelerator
import mpdoctor.probe.child, mpdoctor.instrument.recorder, mpdoctor.env.inprocess  # as the probe's child does
sys.path.insert(0, folder)
from hot import wide
model, batch = wide()
acc = Accelerator(cpu=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = acc.prepare(model, opt)

def step(n):
    x = batch[torch.arange(n) % batch.shape[0]]
    with acc.autocast():
        loss = model(x).float().pow(2).mean()
    acc.backward(loss)
    opt.step()
    opt.zero_grad(set_to_none=True)

step(2)
resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))  # as the probe does
fits = {}
for n in sorted(sizes, reverse=True):
    try:
        step(n)
        fits[n] = True
    except (RuntimeError, MemoryError):
        fits[n] = False
    gc.collect()
print(",".join(str(n) for n in sorted(fits) if fits[n]))
'''


@live
@pytest.mark.slow
def test_max_batch_is_within_one_step_of_the_true_limit_under_a_memory_cap(tmp_path):
    """A model whose activations take 64 MiB per sample, each child's search capped
    (RLIMIT_AS) at 1500 MiB: the probe's answer against a direct try of each size near
    it, in a fresh process under the same cap."""
    cap = 1500 * 1024 * 1024
    env = {"MPDOCTOR_PROBE_MEMORY_LIMIT": str(cap), "OMP_NUM_THREADS": "1"}
    data = _json(_probe("--model", f"{MODELS / 'hot.py'}:wide", "--modes", "no", "--steps", "2",
                        "--max-batch", "256", "--format", "json", env=env))
    no = _mode(data, "no")
    found, search = no["max_batch"], no["max_batch_search"]
    assert found and found >= 2 and search["cap"] == "--memory-limit" and not search["bounded"]
    step = max(1, search["resolution"])
    assert search["first_failed"] - found == search["resolution"]
    assert data["recommendation"]["batch"] == f"fp32 fits batch {found}"

    script = tmp_path / "try_sizes.py"
    script.write_text(TRY_SIZES)
    sizes = [n for n in range(found - 2 * step, found + 2 * step + 1) if n >= 1]
    out = subprocess.run([sys.executable, str(script), str(cap), str(MODELS), ",".join(map(str, sizes))],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    fitting = [int(x) for x in out.stdout.strip().split(",") if x]
    assert fitting, "not even the smallest size fits: the cap is too tight for this machine"
    true_limit = max(fitting)
    assert true_limit < max(sizes), "the cap did not bind near the probe's answer"
    assert abs(found - true_limit) <= step, (found, true_limit, fitting)


# -- a save_pretrained folder (the Hugging Face convention) ------------------------------------

@live
@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is needed for a save_pretrained folder")
def test_a_save_pretrained_folder_is_loaded_with_its_weights(tmp_path):
    """`probe --model tiny-llama`, the folder `LlamaForCausalLM.save_pretrained` wrote
    (offline, nothing from the Hub): its own weights are trained, not a fresh model.
    The lm_head is scaled before saving so its outputs are far larger than a freshly
    initialised model's: the headroom the user reads is the saved model's."""
    # made here, in this process (the maker is not what is tested: the probe's child that
    # loads the folder is); its own generator leaves the process's seed alone
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=32)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(500.0)
    model.save_pretrained(str(tmp_path / "tiny-llama"))
    assert (tmp_path / "tiny-llama" / "config.json").exists()
    out = _probe("--model", "tiny-llama", "--modes", "no", "--steps", "2", "--seq-len", "8", cwd=tmp_path,
                 env={"COLUMNS": "80", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-3000:]
    text = out.stdout
    assert "not a built-in model" not in out.stderr and "no such file" not in out.stderr
    said = " ".join(line.strip() for line in text.splitlines())  # the 80-column lines joined again
    assert "Model: LlamaForCausalLM from tiny-llama (" in said
    assert "weights from model.safetensors" in said
    assert all(len(line) <= 80 and line == line.rstrip() for line in text.splitlines() if "http" not in line)
    # the saved lm_head (x500) is the module closest to fp16's limit, at hundreds of times a fresh one's
    head = next(line for line in text.splitlines() if line.startswith("  no (against fp16's 65504):"))
    assert head.split(":", 1)[1].split()[0] == "lm_head", head
    # and the trailing-slash path form names the same folder
    from mpdoctor.probe.spec import parse_model_spec

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        spec = parse_model_spec("./tiny-llama/")
    finally:
        os.chdir(cwd)
    assert spec["kind"] == "pretrained" and spec["folder"] == str(tmp_path / "tiny-llama")
    assert spec["weights"] == "model.safetensors"


def test_a_folder_without_a_config_is_exit_2(tmp_path):
    (tmp_path / "weights-only").mkdir()
    out = _probe("--model", "weights-only", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert "the folder 'weights-only' has no config.json" in out.stderr
