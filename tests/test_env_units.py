"""The pieces under check: the compatibility tables, redaction, the config
reader, CUDA_VISIBLE_DEVICES, the allocator config, and explain's sharpening."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from mpdoctor.cli import main
from mpdoctor.env.accel_config import collect_accelerate_config, default_config_path, load_yaml
from mpdoctor.env.checks.config import _alloc_problems
from mpdoctor.env.plan import deepspeed_mode
from mpdoctor.env.redact import anonymize_snapshot, is_secret_name, redact_snapshot, redact_text
from mpdoctor.env.view import parse_visible_devices
from mpdoctor.knowledge import compat

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"


@pytest.mark.parametrize("cc, archs, expect", [
    ((8, 9), ["sm_80", "sm_86", "sm_90"], ("sass", "sm_86")),      # Ada runs the sm_86 cubins
    ((3, 7), ["sm_50", "sm_90"], (None, None)),
    ((12, 0), ["sm_75", "sm_90", "compute_90"], ("ptx", "compute_90")),
    ((8, 7), ["sm_80", "sm_86"], (None, None)),                     # Orin: only sm_87 itself
    ((9, 0), ["sm_90a"], ("sass", "sm_90a")),
    ((10, 3), ["sm_100a"], (None, None)),                            # arch-specific targets are exact
])
def test_arch_coverage(cc, archs, expect):
    assert compat.arch_coverage(cc, archs) == expect


def test_driver_tables():
    assert compat.family_floor("12.8") == "525.60.13"
    assert compat.family_floor("11.8") == "450.80.02"
    assert compat.toolkit_min_driver("12.4") == "550.54.14"
    assert compat.driver_max_cuda("535.183.01") == "12.2"
    assert compat.driver_max_cuda("470.239.06") == "11.4"


def test_gpu_names_resolve_to_capabilities():
    for name, cc in [("Tesla T4", "7.5"), ("NVIDIA GeForce RTX 4090", "8.9"), ("NVIDIA RTX 6000 Ada Generation", "8.9"),
                     ("Quadro RTX 6000", "7.5"), ("NVIDIA TITAN X (Pascal)", "6.1"), ("NVIDIA H100 80GB HBM3", "9.0"),
                     ("Tesla K80", "3.7"), ("NVIDIA A10G", "8.6")]:
        assert compat.gpu_by_name(name)["cc"] == cc, name


def test_every_table_row_names_a_known_source():
    import re

    known = set(compat.sources())
    for name in ("gpus", "precision", "torch_builds", "libraries"):
        for key, rows in compat.table(name).items():
            if key in ("build", "capability", "rocm", "gpu", "fp8_backend", "accelerate_device"):
                for row in rows:
                    cited = re.findall(r"\bS-[A-Z0-9]+", str(row.get("src", "")))
                    assert cited, f"{name}.{key}: a row without a source: {row}"
                    assert set(cited) <= known, f"{name}.{key}: {set(cited) - known}"


def test_redaction():
    assert is_secret_name("HF_TOKEN") and is_secret_name("WANDB_API_KEY") and is_secret_name("AWS_REGION")
    assert is_secret_name("MY_DB_PASSWORD") and not is_secret_name("CUDA_VISIBLE_DEVICES")
    assert redact_text("https://ana:pw@host/x?token=abc&b=1") == "https://<redacted>@host/x?token=<redacted>&b=1"
    assert "hf_" not in redact_text("error: bad token hf_aaaaaaaaaaaaaaaaaaaaaaaaaaaa")
    snap = redact_snapshot({"env": {"HF_TOKEN": "x", "CUDA_HOME": "/usr/local/cuda"},
                            "torch": {"error": {"message": "GET https://u:p@hf.co failed"}}})
    assert snap["env"] == {"HF_TOKEN": "<redacted>", "CUDA_HOME": "/usr/local/cuda"}
    assert "u:p" not in snap["torch"]["error"]["message"]


def test_anonymize_replaces_home_and_user():
    snap = anonymize_snapshot({"platform": {"executable": "/home/ana/venv/bin/python"}, "x": "owner ana, anaconda"},
                              home="/home/ana", user="ana")
    assert snap["platform"]["executable"] == "~/venv/bin/python"
    assert snap["x"] == "owner <user>, anaconda" and snap["anonymized"] is True


ACCELERATE_YAML = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: ds.json
  zero3_init_flag: false
distributed_type: DEEPSPEED
downcast_bf16: 'no'
mixed_precision: no
num_processes: 8
tpu_env: []
fsdp_config: {}
"""


def test_bounded_yaml_reader_agrees_with_pyyaml():
    assert load_yaml(ACCELERATE_YAML) == yaml.safe_load(ACCELERATE_YAML)


def test_accelerate_config_reads_the_deepspeed_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acc.yaml").write_text(ACCELERATE_YAML)
    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}))
    sec = collect_accelerate_config(str(tmp_path / "acc.yaml"))
    assert sec["config"]["mixed_precision"] is False  # YAML 1.1: unquoted no
    assert sec["deepspeed"]["exists"] and deepspeed_mode(sec["deepspeed"]["config"]) == "auto"
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    assert collect_accelerate_config(str(tmp_path / "bad.yaml"))["error"]["type"] == "ConfigParseError"


def test_default_config_path_follows_hf_home():
    assert default_config_path({"HF_HOME": "/data/hf"}) == "/data/hf/accelerate/default_config.yaml"
    assert default_config_path({"XDG_CACHE_HOME": "/c"}) == "/c/huggingface/accelerate/default_config.yaml"


@pytest.mark.parametrize("ds, mode", [
    ({"fp16": {"enabled": True}}, "fp16"), ({"bf16": {"enabled": "true"}}, "bf16"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both"), ({"fp16": {"enabled": "auto"}}, "auto"),
    ({"fp16": {"enabled": False}}, "no"), ({"zero_optimization": {}}, None),
])
def test_deepspeed_mode(ds, mode):
    assert deepspeed_mode(ds) == mode


GPUS = [{"index": i, "uuid": f"GPU-{i}aaa1111-2222"} for i in range(4)]


@pytest.mark.parametrize("value, shown, invalid", [
    (None, None, []), ("", [], []), ("1,2", [1, 2], []), ("0,7,1", [0], ["7", "1"]), ("-1", [], ["-1"]),
    ("GPU-2aaa", [2], []),
])
def test_cuda_visible_devices(value, shown, invalid):
    assert parse_visible_devices(value, GPUS) == (shown, invalid)


def test_alloc_conf_problems():
    assert _alloc_problems("expandable_segments:True,max_split_size_mb:128", "2.6.0") == ([], [])
    bad, _ = _alloc_problems("expandable_segments:true", "2.6.0")
    assert "must be True or False" in bad[0]
    bad, _ = _alloc_problems("expandable_segments:True", "2.0.1")
    assert "needs torch >= 2.1" in bad[0]
    _, unknown = _alloc_problems("max_split_size:512", "2.6.0")
    assert unknown == ["'max_split_size' (did you mean max_split_size_mb?)"]


# --- explain --snapshot ----------------------------------------------------------------------

BF16_CUBLAS = """\
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 57, in <module>
    loss = model(**batch).loss
RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`
"""
OOM = """\
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 88, in <module>
    loss = model(batch).loss
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.52 GiB memory in use. Of the allocated memory 20.81 GiB is allocated by PyTorch, and 1.25 GiB is reserved by PyTorch but unallocated.
"""


def explain(tmp_path: Path, text: str, snapshot: str) -> tuple[int, dict]:
    log = tmp_path / "train.log"
    log.write_text(text)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = main(["explain", str(log), "--snapshot", str(SNAPS / snapshot), "--format", "json"])
    return rc, json.loads(out.getvalue())


def test_bf16_cublas_failure_on_a_v100_says_use_fp16(tmp_path):
    rc, report = explain(tmp_path, BF16_CUBLAS, "v100-bf16.json")
    top = report["findings"][0]
    assert rc == 1
    assert top["explanation"].startswith("Your Tesla V100-SXM2-16GB (sm_70) has no bf16: use fp16.")
    assert "fp16" in top["fixes"][0]
    assert {"line": None, "text": "7.0", "source": "torch.devices[0].capability"} in top["evidence"]
    assert report["input"]["snapshot"].endswith("v100-bf16.json")


def test_bf16_failure_on_an_a100_rules_out_the_gpu(tmp_path):
    _, report = explain(tmp_path, BF16_CUBLAS, "a100-bf16.json")
    assert "does support bf16 natively, so the GPU is not the cause" in report["findings"][0]["explanation"]


def test_oom_in_fp32_suggests_the_half_precision_the_gpu_has(tmp_path):
    _, plain = explain(tmp_path, OOM, "a100-bf16.json")  # config asks bf16: no suggestion
    assert "native bf16" not in plain["findings"][0]["explanation"]
    snap = json.loads((SNAPS / "rtx4090-fp8-cu118.json").read_text())
    snap["accelerate_config"] = {"path": "none", "source": "default", "exists": False}
    (tmp_path / "fp32.json").write_text(json.dumps(snap))
    out = io.StringIO()
    log = tmp_path / "oom.log"
    log.write_text(OOM)
    with redirect_stdout(out):
        main(["explain", str(log), "--snapshot", str(tmp_path / "fp32.json"), "--format", "json"])
    top = json.loads(out.getvalue())["findings"][0]
    assert "NVIDIA GeForce RTX 4090 has 23.65 GiB and native bf16" in top["explanation"]
    assert top["fixes"][0].startswith("Train in bf16 on this NVIDIA GeForce RTX 4090")


def test_oom_with_memory_held_by_another_process(tmp_path):
    _, report = explain(tmp_path, OOM, "gpu-memory-held-fp16.json")
    top = report["findings"][0]
    assert "On this machine: GPU 0 NVIDIA GeForce RTX 3090: 20.10 GiB of 24.00 GiB is already held by other processes" \
        in top["explanation"]


def test_explain_with_a_bad_snapshot_exits_2(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(OOM)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = main(["explain", str(log), "--snapshot", str(tmp_path / "missing.json")])
    assert rc == 2 and "no such file" in err.getvalue()
