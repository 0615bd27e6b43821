"""`mpdoctor check --snapshot` on the recorded machines in fixtures/snapshots/: each
snapshot's expected verdicts, as a user sees them (rule, exit status, the checklist)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from mpdoctor.cli import main

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"

# snapshot -> the error and warning findings it must produce, exactly (info notes aside)
EXPECTED = {
    "a100-bf16": set(),
    "v100-bf16": {"bf16-below-sm80", "flash-attn-needs-ampere"},
    "t4-old-driver-fp16": {"driver-too-old-for-build", "fp16-silently-fp32-on-cpu"},
    "gtx1080ti-fp16": {"fp16-slower-than-fp32"},
    "k80-current-torch": {"driver-too-old-for-build", "no-kernel-image-for-gpu", "fp16-silently-fp32-on-cpu",
                          "accelerate-needs-newer-torch", "library-requirement-unmet", "host-memory-low"},
    "h100-fp8-no-te": {"fp8-no-backend"},
    "h100-fp8-te": {"cudnn-version-mismatch"},
    "rtx4090-fp8-cu118": {"fp8-no-backend"},
    "a100-fp8": {"fp8-below-sm89"},
    "cpu-laptop-fp16": {"fp16-silently-fp32-on-cpu"},
    # issue 19 item 3: fp8 on a CPU (the fix names bf16, never fp16); a MULTI_GPU config without CUDA
    "cpu-fp8": {"fp8-below-sm89"},
    "cpu-multi-gpu-config": {"multi-gpu-config-no-cuda"},
    "dev-cpu-fp16": {"fp16-silently-fp32-on-cpu"},
    "apple-m1-mps-fp16": {"mps-precision-refused"},
    "rocm-mi250-bf16": set(),
    "torch-missing-libcudart": {"torch-import-missing-library"},
    "torch-import-hangs": {"torch-import-fails"},
    "cpu-torch-on-gpu-bf16": {"cpu-only-torch-with-gpu", "bf16-cpu-not-native"},
    "cpu-torch-on-gpu-fp16": {"cpu-only-torch-with-gpu", "fp16-silently-fp32-on-cpu"},
    "deepspeed-conflict": {"deepspeed-precision-conflict", "gpu-ecc-errors"},
    "deepspeed-overrides": {"deepspeed-overrides-mixed-precision"},
    "deepspeed-missing-json": {"deepspeed-config-missing"},
    "gpu-memory-held-fp16": {"gpu-memory-held-by-others", "nvidia-wheel-pin-mismatch", "alloc-conf-unknown-key"},
    "l4-multi-gpu-config-one-gpu": {"mixed-precision-unknown-value", "alloc-conf-malformed", "cuda-visible-devices-invalid",
                                    "num-processes-exceeds-gpus", "multi-gpu-config-one-gpu", "precision-sources-disagree"},
    "rtx5090-cu124-ptx": {"gpu-runs-on-ptx-only"},
    "broken-accelerate-config": {"accelerate-config-unreadable"},
    # no accelerate config: a run in fp32 (explain --snapshot's OOM refinements)
    "rtx4090-fp32-no-config": set(),
    "v100-fp32-no-config": {"flash-attn-needs-ampere"},
    # accelerate without Requires-Dist metadata: its torch floor from mpdoctor's table
    "accelerate-no-requires-old-torch": {"driver-too-old-for-build", "no-kernel-image-for-gpu",
                                         "fp16-silently-fp32-on-cpu", "accelerate-needs-newer-torch",
                                         "library-requirement-unmet", "host-memory-low"},
}


def check(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["check", *args])
    return rc, out.getvalue(), err.getvalue()


def report_for(name: str, *extra: str) -> tuple[int, dict]:
    rc, out, _ = check("--snapshot", str(SNAPS / f"{name}.json"), "--format", "json", *extra)
    return rc, json.loads(out)


def test_every_snapshot_has_expectations():
    assert {p.stem for p in SNAPS.glob("*.json")} == set(EXPECTED)
    assert len(EXPECTED) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_snapshot_verdicts(name):
    rc, report = report_for(name)
    got = {f["rule"] for f in report["findings"] if f["severity"] in ("error", "warning")}
    assert got == EXPECTED[name]
    has_error = any(f["severity"] == "error" for f in report["findings"])
    assert rc == (1 if has_error else 0)
    for f in report["findings"]:
        assert f["evidence"], f"{f['rule']} cites no evidence"
        assert all(e["line"] is None and e["source"] for e in f["evidence"])


def test_v100_bf16_names_the_gpu_and_the_trap():
    _, report = report_for("v100-bf16")
    f = next(f for f in report["findings"] if f["rule"] == "bf16-below-sm80")
    assert f["title"] == "bf16 asked for on Tesla V100-SXM2-16GB (sm_70): this GPU has no bf16 hardware"
    assert "is_bf16_supported() returns True here" in f["explanation"]
    assert f["fixes"][0].startswith("Use fp16 instead")
    assert {"source": "torch.devices[0].capability", "text": "7.0", "line": None} in f["evidence"]


def test_t4_driver_finding_reads_out_the_numbers():
    _, report = report_for("t4-old-driver-fp16")
    top = report["findings"][0]
    assert top["rule"] == "driver-too-old-for-build"  # the cause ranks above its consequence
    assert "470.239.06" in top["title"] and "12.4" in top["title"]
    assert "525.60.13" in top["explanation"] and "CUDA up to 11.4" in top["explanation"]


def test_k80_no_kernel_image_is_one_finding_for_both_gpus():
    _, report = report_for("k80-current-torch")
    f = next(f for f in report["findings"] if f["rule"] == "no-kernel-image-for-gpu")
    assert f["count"] == 2
    assert "sm_37 was removed from CUDA 12.0" in f["explanation"]
    assert "cu118" in f["fixes"][0]


def test_fp8_matrix_gives_each_backend_its_reason():
    _, report = report_for("rtx4090-fp8-cu118")
    rows = {r["backend"]: r for r in report["fp8"]}
    te = rows["TransformerEngine"]
    assert te["installed"] == "1.9.0" and te["usable"] is False
    assert any(c["requirement"] == "CUDA >= 12.1 on Ada" and c["ok"] is False for c in te["checks"])
    assert rows["torchao"]["installed"] is None
    _, healthy = report_for("h100-fp8-te")
    assert {r["backend"]: r["usable"] for r in healthy["fp8"]}["TransformerEngine"] is True


def test_precision_plan_names_both_values_where_sources_disagree():
    _, report = report_for("l4-multi-gpu-config-one-gpu")
    plan = report["precision_plan"]
    assert plan["under_launch"] == "bf16" and plan["under_python"] == "bogus"
    d = plan["disagreements"][0]
    assert (d["first_value"], d["second_value"]) == ("bf16", "bogus")
    _, ds = report_for("deepspeed-conflict")
    assert ds["precision_plan"]["effective"] is None
    assert "cannot be set to `bf16` when `fp16`" in ds["precision_plan"]["effective_reason"]
    _, over = report_for("deepspeed-overrides")
    assert over["precision_plan"]["requested"] == "bf16"
    assert over["precision_plan"]["requested_from"] == "DeepSpeed config"


def test_rocm_is_recognised_and_nvidia_checks_skipped():
    _, report = report_for("rocm-mi250-bf16")
    skipped = {s["rule"]: s["reason"] for s in report["skipped"]}
    assert skipped["driver-too-old-for-build"].startswith("ROCm build (HIP 6.2")
    assert "bf16-below-sm80" in skipped
    rc, fp8 = report_for("rocm-mi250-bf16", "--mixed-precision", "fp8")
    assert rc == 1
    f = next(f for f in fp8["findings"] if f["rule"] == "fp8-below-sm89")
    assert "MI300" in f["title"]


def test_mixed_precision_argument_overrides_the_config():
    rc, report = report_for("a100-bf16", "--mixed-precision", "fp16")
    assert rc == 0 and report["precision_plan"]["requested"] == "fp16"
    assert any(d["first"] == "--mixed-precision" for d in report["precision_plan"]["disagreements"])
    rc, report = report_for("v100-bf16", "--mixed-precision", "fp16")
    assert rc == 0 and "bf16-below-sm80" not in {f["rule"] for f in report["findings"]}


def test_skipped_checks_are_listed_with_why_not_passed():
    rc, out, _ = check("--snapshot", str(SNAPS / "cpu-laptop-fp16.json"))
    assert "Skipped (" in out and "no NVIDIA driver answered (NVML Shared Library Not Found)" in out
    assert "– Driver and CUDA build" in out  # the area itself is marked skipped, not ✓


def test_markdown_is_a_pasteable_block():
    rc, out, _ = check("--snapshot", str(SNAPS / "v100-bf16.json"), "--format", "markdown")
    assert rc == 1
    assert out.startswith("## mpdoctor check --snapshot")
    assert "- ✗ **Hardware precision**" in out and "    - fix: Use fp16 instead" in out
    assert "### Findings" in out and "**Evidence**" in out


def test_json_output_is_stable():
    _, report = report_for("a100-bf16")
    assert set(report) >= {"checklist", "precision_plan", "modes", "fp8", "skipped", "findings", "input", "unrecognised"}
    assert [a["id"] for a in report["checklist"]["areas"]] == ["torch", "precision", "driver", "arch", "libraries",
                                                             "accelerate", "memory"]
    assert all(a["status"] in ("ok", "warning", "error", "skipped") for a in report["checklist"]["areas"])


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"torch": {}}', "not an mpdoctor snapshot"),
    ('{"schema": 99}', "newer than this mpdoctor reads"),
    ('{"schema": 1, "torch": []}', "\"torch\" must be a JSON object"),
    ("[1, 2]", "a snapshot is a JSON object"),
])
def test_bad_snapshots_exit_2_with_a_clear_message(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    rc, out, err = check("--snapshot", str(p))
    assert rc == 2 and message in err and "Traceback" not in err


def test_missing_files_exit_2(tmp_path):
    rc, _, err = check("--snapshot", str(tmp_path / "nope.json"))
    assert rc == 2 and "no such file" in err
    rc, _, err = check("--snapshot", str(SNAPS / "a100-bf16.json"), "--config-file", str(tmp_path / "nope.yaml"))
    assert rc == 2 and "--config-file" in err


def test_config_file_judged_against_a_recorded_machine(tmp_path):
    cfg = tmp_path / "acc.yaml"
    cfg.write_text("distributed_type: MULTI_GPU\nnum_processes: 8\nmixed_precision: fp16\n")
    rc, out, _ = check("--snapshot", str(SNAPS / "a100-bf16.json"), "--config-file", str(cfg), "--format", "json")
    report = json.loads(out)
    assert rc == 1
    assert {"num-processes-exceeds-gpus", "multi-gpu-config-one-gpu"} <= {f["rule"] for f in report["findings"]}
    assert report["precision_plan"]["requested"] == "fp16"


def test_a_rule_naming_an_unknown_check_is_exit_2(tmp_path):
    (tmp_path / "bad.toml").write_text(
        'id = "my-rule"\nkind = "env"\ncategory = "accelerate-config"\ntitle = "x"\ncheck = "no_such_check"\n'
        '[[example]]\nsnapshot = "a.json"\n[[near_miss]]\nsnapshot = "b.json"\n')
    rc, _, err = check("--snapshot", str(SNAPS / "a100-bf16.json"), "--rules", str(tmp_path))
    assert rc == 2 and "no_such_check" in err


def test_probe_hook_appends_the_probe_section():
    # a snapshot whose torch does not import is not probed; the probe says so under "Probe"
    rc, out, _ = check("--snapshot", str(SNAPS / "torch-missing-libcudart.json"), "--probe")
    assert rc == 1
    assert "Probe" in out and "not run: torch does not import here (import-error)" in out
    rc, out, _ = check("--snapshot", str(SNAPS / "torch-missing-libcudart.json"), "--probe", "--format", "json")
    assert json.loads(out)["probe"]["ran"] is False
