"""The probe's judgement, without children: rows from measurements, the honesty rules
(no speed-up for a mode that did not run), and the recommendation."""

from __future__ import annotations

import json
import subprocess
import sys

from mpdoctor import rulebase
from mpdoctor.diagnosis.probe import ModeJudge
from mpdoctor.probe.recommend import recommend
from mpdoctor.probe.report import ProbeReport, to_markdown
from mpdoctor.probe.rows import ModeRow, build_rows
from mpdoctor.probe.runner import ChildOutcome, ProbeOptions


def row(mode: str, **kw) -> ModeRow:
    base = dict(ok=True, ran_as_requested=True, step_time_s=0.1, speedup=1.0, memory_saving=0.0,
                loss_rel_diff=0.0, autocast_dtype={"no": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(mode),
                skipped_steps=0, steps=20)
    base.update(kw)
    return ModeRow(mode=mode, **base)


def test_fastest_good_mode_is_recommended_with_its_reason_and_config_line():
    rec = recommend([row("no"), row("fp16", speedup=1.5, memory_saving=0.3, loss_rel_diff=0.004),
                     row("bf16", speedup=1.8, memory_saving=0.45, loss_rel_diff=0.003)])
    assert rec["mode"] == "bf16"
    assert rec["reason"] == "bf16: 1.80× faster than fp32, 45% less memory, loss within 0.3%"
    assert rec["config"]["accelerate_config"] == "mixed_precision: bf16"
    assert rec["config"]["code"] == 'Accelerator(mixed_precision="bf16")'


def test_near_tie_prefers_bf16_over_fp16():
    rec = recommend([row("no"), row("fp16", speedup=1.62), row("bf16", speedup=1.58)])
    assert rec["mode"] == "bf16"


def test_clear_fp16_win_beats_bf16():
    rec = recommend([row("no"), row("fp16", speedup=2.4), row("bf16", speedup=1.3)])
    assert rec["mode"] == "fp16"


def test_a_mode_that_did_not_run_is_never_recommended():
    # A "speed-up" on a mode whose first matmul stayed float32 is noise, not fp16.
    rec = recommend([row("no"), row("fp16", ran_as_requested=False, autocast_dtype="float32", speedup=1.3)])
    assert rec["mode"] == "no"
    assert "fp16 did not run" in rec["reason"]


def test_nonfinite_far_loss_and_skipping_modes_are_excluded():
    rows = [row("no"), row("fp16", speedup=2.0, nonfinite_count=3), row("bf16", speedup=1.9, loss_rel_diff=0.2)]
    rec = recommend(rows)
    assert rec["mode"] == "no"
    assert "non-finite" in rec["reason"] and "20.0% off fp32" in rec["reason"]
    assert recommend([row("no"), row("fp16", speedup=2.0, skipped_steps=10)])["mode"] == "no"


def test_slower_but_leaner_mode_is_offered_for_memory_bound_training():
    rec = recommend([row("no"), row("bf16", speedup=0.6, memory_saving=0.3)])
    assert rec["mode"] == "no"
    assert rec["if_memory_bound"]["mode"] == "bf16"
    assert "30% less memory" in rec["if_memory_bound"]["reason"]


def test_as_fast_and_leaner_is_recommended_on_memory():
    rec = recommend([row("no"), row("bf16", speedup=1.02, memory_saving=0.4)])
    assert rec["mode"] == "bf16" and rec["basis"] == "memory"


def test_busy_gpu_run_keeps_its_verdict_with_a_caveat():
    rec = recommend([row("no", cpu_used_by_others=0.6), row("bf16", speedup=1.5)], device_type="cuda")
    assert rec["mode"] == "bf16" and rec["timings_reliable"] is False
    assert "timings are unreliable (no: other processes used 60% of the CPUs)" in rec["reason"]


def test_busy_cpu_gives_no_speed_verdict():
    # A neighbour's job made fp32 look slow: bf16's "1.5x" is the neighbour, not bf16.
    rows = [row("no", cpu_used_by_others=0.6), row("bf16", speedup=1.5, memory_saving=0.28, loss_rel_diff=1e-5)]
    rec = recommend(rows, device_type="cpu")
    assert rec["mode"] == "no" and rec["basis"] == "timings unreliable"
    assert "Modes that train here: no, bf16 (28% less memory, loss within 0.001%)" in rec["reason"]
    assert rec["if_memory_bound"]["mode"] == "bf16" and "faster" not in rec["if_memory_bound"]["reason"]
    # wildly varying steps are noise too, busy or not
    assert recommend([row("no"), row("bf16", speedup=1.5, step_time_spread=1.2)], "cpu")["mode"] == "no"


def test_no_working_mode_recommends_nothing():
    rec = recommend([row("no", ok=False), row("bf16", ok=False)])
    assert rec["mode"] is None and rec["config"] is None


def _result(mode: str, step: float, peak: int, dtype: str, loss: float, logits: list[float]) -> dict:
    return {"mode": mode, "ok": True, "device": {"type": "cpu", "name": "test cpu", "native_bf16": []},
            "accelerate": "1.16.0", "native_amp": mode != "fp16", "steps": 10, "warmup": 2,
            "step_times_s": [step] * 10, "step_time_s": step, "final_loss": loss,
            "peak_memory_bytes": peak, "memory_kind": "rss_peak_growth", "autocast_dtype": dtype,
            "fp8_modules": 0, "observed": {"skipped_steps": 0, "scaler": {"present": False}, "nonfinite": [],
                                           "nonfinite_count": 0, "source": "mpdoctor.instrument.watch",
                                           "watch": {"plan": {"requested": mode, "autocast_dtype": dtype,
                                                              "device": "cpu"}}},
            # the environment the child ran in, as env.inprocess records it (a CPU-only torch)
            "env": {"torch": {"status": "ok", "version": "2.13.0+cpu", "cuda_build": None, "cuda_available": False,
                              "device_count": 0}, "packages": {"versions": {"accelerate": "1.16.0"}}},
            "eval": {"peak_abs": 3.0, "nonfinite_logits": 0, "logits": logits, "logits_count": len(logits)}}


def _outcome(mode: str, result: dict | None, **kw) -> ChildOutcome:
    base = dict(returncode=0 if result else 1, timed_out=False, wall_s=1.0, stderr_tail="",
                last_phase="train", last_step=0)
    base.update(kw)
    return ChildOutcome(mode=mode, result=result, **base)


def test_rows_compare_against_fp32_and_refuse_gains_for_a_mode_that_did_not_run():
    ref = [1.0, -2.0, 4.0, 0.5]
    outs = [_outcome("no", _result("no", 0.10, 100, "float32", 2.0, ref)),
            # accelerate's fp16 on a CPU: fp32 really ran (and happened to be faster)
            _outcome("fp16", _result("fp16", 0.08, 80, "float32", 2.0, ref)),
            _outcome("bf16", _result("bf16", 0.05, 60, "bfloat16", 2.01, [1.0, -2.0, 4.02, 0.5]))]
    rows = {r.mode: r for r in build_rows(outs, ProbeOptions(), ModeJudge(rulebase.load()))}
    assert rows["fp16"].speedup is None and rows["fp16"].memory_saving is None
    assert rows["fp16"].ran_as_requested is False
    f = rows["fp16"].findings[0]
    assert (f.category, f.severity, f.rule) == ("fp16-unsupported-device", "warning", "fp16-silently-fp32-on-cpu")
    assert "float32" in f.title and f.facts["mode"] == "fp16"
    assert abs(rows["bf16"].speedup - 2.0) < 1e-9
    assert abs(rows["bf16"].memory_saving - 0.4) < 1e-9
    assert abs(rows["bf16"].loss_rel_diff - 0.005) < 1e-9
    assert abs(rows["bf16"].logits_rel_diff - 0.02 / 4.0) < 1e-9  # max |diff| over max |ref|
    rep = ProbeReport(rows=list(rows.values()), recommendation=recommend(list(rows.values())),
                      options={"steps": 10, "warmup": 2})
    md = to_markdown(rep)
    assert "| fp16 | ! ran float32 | 80.0 ms ±0% | n/a | 80 B | n/a |" in md
    assert "Recommendation: bf16: 2.00× faster than fp32, 40% less memory, loss within 0.5%" in md
    data = json.loads(rep.to_json())
    assert data["modes"][1]["speedup"] is None and data["modes"][1]["findings"][0]["category"] == "fp16-unsupported-device"


def test_failed_child_row_carries_the_rule_base_explanation():
    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
            "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half\n")
    outs = [_outcome("no", _result("no", 0.1, 100, "float32", 2.0, [1.0])),
            _outcome("fp16", None, stderr_tail=tail, last_step=2)]
    rows = build_rows(outs, ProbeOptions(), ModeJudge(rulebase.load()))
    assert rows[1].ok is False
    assert rows[1].error == "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half"
    # the machine's own answer first (fp16 on a CPU is fp32: the same plan `check` judges),
    # then the failure's explanation from the log rules, both tagged with the mode
    cats = [f.category for f in rows[1].findings]
    assert cats[0] == "fp16-unsupported-device" and "dtype-mismatch" in cats
    assert all(f.facts["mode"] == "fp16" for f in rows[1].findings)


def test_parent_side_never_imports_torch():
    code = ("import sys, mpdoctor.probe, mpdoctor.probe.rows, mpdoctor.probe.recommend, mpdoctor.probe.report, mpdoctor.cli;"
            "import mpdoctor.probe.spec, mpdoctor.probe.maxbatch, mpdoctor.commands.probe;"
            "bad = [m for m in ('torch', 'accelerate', 'numpy') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_bad_arguments_exit_2_with_a_clear_message():
    for args in (["--modes", "fp32"], ["--steps", "1"], ["--batch-size", "0"]):
        out = subprocess.run([sys.executable, "-m", "mpdoctor", "probe", *args], capture_output=True, text=True)
        assert out.returncode == 2, args
        assert out.stderr.startswith("mpdoctor: ") and "Traceback" not in out.stderr


def test_check_probe_does_not_probe_here_for_another_machines_snapshot():
    from pathlib import Path

    from mpdoctor.diagnosis.probe import run_probe_for_check

    snap = json.loads((Path(__file__).resolve().parents[1] / "fixtures/snapshots/a100-bf16.json").read_text())
    out = run_probe_for_check(snap, progress=False)
    assert out["ran"] is False and out["findings"] == []
    assert "from another machine (AMD EPYC 7742" in out["lines"][0]


# -- --model SPEC, parsed on the parent side ----------------------------------------

def test_model_spec_forms(tmp_path, monkeypatch):
    import pytest

    from mpdoctor.probe.spec import ModelSpecError, parse_model_spec

    assert parse_model_spec("mlp") == {"kind": "builtin", "name": "mlp", "spec": "mlp"}
    f = tmp_path / "m.py"
    f.write_text("def make_model(): pass\n")
    assert parse_model_spec(str(f)) == {"kind": "file", "path": str(f), "factory": None, "spec": str(f)}
    assert parse_model_spec(f"{f}:build")["factory"] == "build"
    monkeypatch.chdir(tmp_path)
    assert parse_model_spec("m:make_model") == {"kind": "module", "module": "m", "factory": "make_model",
                                                "spec": "m:make_model"}
    assert parse_model_spec("m.py:make_model")["kind"] == "file"
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    spec = parse_model_spec("config.json")
    assert (spec["kind"], spec["model_type"], spec["path"]) == ("config", "gpt2", str(cfg))
    for bad, words in [("", "empty SPEC"), ("m", "not a built-in model"), ("x/y.py", "no such file"),
                       ("1abc:make", "is not a module name"), ("m:2x", "is not a function name")]:
        with pytest.raises(ModelSpecError, match=words):
            parse_model_spec(bad)


def test_sizes():
    import pytest

    from mpdoctor.probe.spec import parse_bytes

    assert parse_bytes("1500M") == 1500 << 20 and parse_bytes("2G") == 2 << 30 and parse_bytes("1.5GB") == 1.5e9
    assert parse_bytes("123456789") == 123456789
    for bad in ("lots", "-1G", "0", "2 parsecs"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_timeouts_that_never_come_are_refused():
    import math

    import pytest

    for t in (math.nan, math.inf, -math.inf, 0.0, -5.0):
        with pytest.raises(ValueError, match="--timeout must be a positive number of seconds"):
            ProbeOptions(timeout_s=t).validate()
    ProbeOptions(timeout_s=0.5).validate()


# -- --max-batch's search, against a known limit ---------------------------------------

class _CPU:
    type = "cpu"


def _search(limit: int, start: int, upper: int = 4096):
    from mpdoctor.probe.maxbatch import search

    tried = []

    def try_step(n: int) -> None:
        tried.append(n)
        if n > limit:
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {n << 20} bytes")

    return search(try_step, start, upper, None, _CPU()), tried


def test_max_batch_search_lands_within_one_step_of_the_limit():
    from mpdoctor.probe.maxbatch import resolution

    for limit in (1, 7, 8, 24, 48, 63, 100, 1000, 3000):
        for start in (1, 8, 16):
            found, tried = _search(limit, start)
            if start > limit:
                assert found["batch"] == max(n for n in tried if n <= limit)
            else:
                assert limit - resolution(found["batch"]) <= found["batch"] <= limit, (limit, start, found)
                assert found["first_failed"] - found["batch"] == found["resolution"]
            assert len(tried) <= 2 * (limit.bit_length() + 6)  # bounded: doubling, then bisection
            assert found["tries"][-1]["batch"] == tried[-1] and all(len(t) >= 3 for t in found["tries"])


def test_max_batch_search_halves_when_the_probe_batch_does_not_fit_and_stops_at_the_bound():
    found, tried = _search(limit=5, start=32)
    assert tried[:4] == [32, 16, 8, 4] and found["batch"] == 5
    found, tried = _search(limit=10**9, start=8, upper=100)
    assert found["batch"] == 100 and found["bounded"] is True and tried == [8, 16, 32, 64, 100]
    found, _ = _search(limit=0, start=4)
    assert found["batch"] == 0


def test_an_error_that_is_not_out_of_memory_is_not_swallowed():
    import pytest

    from mpdoctor.probe.maxbatch import is_oom, search

    def broken(n: int) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        search(broken, 8, 64, None, _CPU())
    assert is_oom(MemoryError()) and is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(ValueError("out of memory"))


def test_recommendation_says_the_largest_batch_of_each():
    rows = [row("no", max_batch=24, max_batch_search={"batch": 24, "bounded": False}),
            row("bf16", speedup=1.5, max_batch=48, max_batch_search={"batch": 48, "bounded": False})]
    rec = recommend(rows)
    assert rec["mode"] == "bf16" and rec["max_batch"] == {"no": 24, "bf16": 48}
    assert rec["batch"] == "bf16 fits batch 48 where fp32 fits 24"
    rep = ProbeReport(rows=rows, recommendation=rec, options={"steps": 10, "warmup": 2})
    md = to_markdown(rep)
    assert "Largest batch that trains: bf16 fits batch 48 where fp32 fits 24" in md
    assert md.splitlines()[2].endswith("| fp16 headroom | max batch |")


def test_headroom_is_reported_and_the_table_fits_80_columns():
    from rich.console import Console

    from mpdoctor.probe.report import print_terminal

    near = {"module": "encoder.layers.3.fc2", "type": "Linear", "absmax": 40000.0, "dtype": "float32",
            "headroom": 8.5e33, "fp16_headroom": 1.6376}
    rows = [row("no", fp16_headroom=[near], headroom=[near], step_time_spread=0.02),
            row("bf16", speedup=1.3, headroom=[dict(near, dtype="bfloat16", headroom=8.5e33)], step_time_spread=0.03)]
    rep = ProbeReport(rows=rows, recommendation=recommend(rows), options={"steps": 10, "warmup": 2})
    console = Console(width=80, record=True, force_terminal=False)
    print_terminal(rep, console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "fp16 headroom" in text and "1.64×" in text
    assert "no (against fp16's 65504): encoder.layers.3.fc2 4e+04 (1.64×)" in text
