"""The core says only what its rules say: a check that raises is a failure, a guess keeps
its frame through any merge, every finding's words re-render from its rule and facts,
and the defects a review found each stay fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.assemble import assemble, conclude, merge_findings
from mpdoctor.engine.judge import CheckCrashed, judge_rules, strict_checks
from mpdoctor.engine.selftest import run_selftest
from mpdoctor.findings import Evidence

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"
RULES = rulebase.load()
BY_ID = {r.id: r for r in RULES}


# --- a check that raises is loud ------------------------------------------------------------

def _broken(view):
    raise KeyError("gpus")


def _healthy(view):
    return []


def test_a_check_that_raises_fails_under_strict_checks_and_is_named_to_a_user_otherwise(monkeypatch):
    rule = BY_ID["bf16-below-sm80"]
    monkeypatch.delenv("MPDOCTOR_STRICT_CHECKS", raising=False)
    with strict_checks(), pytest.raises(CheckCrashed, match="bf16-below-sm80.*KeyError"):
        judge_rules(object(), [rule], {rule.check: _broken})
    with strict_checks(False):
        outcome, = judge_rules(object(), [rule], {rule.check: _broken})
    assert outcome.findings == [] and outcome.crashed
    assert outcome.skipped == "could not be judged (KeyError: 'gpus')"


def test_rules_test_fails_a_near_miss_whose_check_raises(monkeypatch):
    from mpdoctor.env import judge as env_judge

    rule = BY_ID["bf16-below-sm80"]
    broken = dict(env_judge.env_checks())
    broken[rule.check] = _broken
    monkeypatch.setattr(env_judge, "_CHECKS", broken)
    results = run_selftest(RULES, rulebase.case_runners(), [rule], sentences=False)
    near = [r for r in results if r.kind == "near_miss"]
    assert near and not any(r.ok for r in near)
    assert any("raised KeyError" in r.message for r in near), [r.message for r in near]


def test_a_near_miss_must_reach_its_check(monkeypatch):
    from mpdoctor.engine.judge import Skip
    from mpdoctor.env import judge as env_judge

    rule = BY_ID["bf16-below-sm80"]
    skipping = dict(env_judge.env_checks())
    skipping[rule.check] = lambda view: Skip("never looked")
    monkeypatch.setattr(env_judge, "_CHECKS", skipping)
    results = run_selftest(RULES, rulebase.case_runners(), [rule], sentences=False)
    assert any(not r.ok and "no near miss reaches check" in r.message for r in results), results


# --- the defects of the review ---------------------------------------------------------------

def test_accelerate_torch_requirement_from_the_table_when_metadata_has_none():
    from mpdoctor.env.judge import judge

    snap = json.loads((SNAPS / "accelerate-no-requires-old-torch.json").read_text())
    assert "accelerate" not in snap["packages"]["requires"]
    found = {f.rule: f for f in judge(snap, rules=RULES).findings}
    f = found["accelerate-needs-newer-torch"]
    assert f.facts["where"] == "accelerate's setup.py (mpdoctor table)"
    assert f.facts["spec"] == ">=2.6.0"


def test_a_step_number_is_not_a_gpu_name():
    from mpdoctor.logs import explain_text

    log = """{'loss': 1.2, 'grad_norm': 0.3, 'learning_rate': 1e-05, 'epoch': 0.4, 'step': 2080}
Traceback (most recent call last):
  File "finetune.py", line 271, in <module>
    trainer.train()
  File "/venv/lib/python3.10/site-packages/transformers/trainer.py", line 1973, in _inner_training_loop
    self.scaler.unscale_(self.optimizer)
ValueError: Attempting to unscale FP16 gradients.
"""
    top = explain_text(log, RULES).findings[0]
    assert top.rule == "unscale-fp16-gradients-hf"
    assert "gpu_v100" not in top.facts
    assert "2080" not in top.explanation
    on_t4 = explain_text(log.replace("{'loss'", "GPU: Tesla T4\n{'loss'"), RULES).findings[0]
    assert on_t4.facts["gpu_v100"] == "Tesla T4"


def test_the_gpu_evidence_is_kept_when_a_bf16_finding_is_sharpened_on_a_pre_ampere_gpu():
    from mpdoctor.diagnosis.sharpen import refinement_findings
    from mpdoctor.env.judge import make_view
    from mpdoctor.logs import explain_text

    log = ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, "
           "n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, "
           "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`\n")
    top = explain_text(log, RULES).findings[0]
    snap = json.loads((SNAPS / "v100-bf16.json").read_text())
    found = refinement_findings(top, make_view(snap, "bf16"), RULES)
    no_bf16 = next(f for f in found if f.rule == "machine-gpu-without-bf16")
    assert Evidence("7.0", None, "torch.devices[0].capability") in no_bf16.evidence


# --- a guess stays a guess ---------------------------------------------------------------------

def _likely(rule_id: str, **facts):
    return assemble(BY_ID[rule_id], {"likely": "70%", "shared_words": "scaler, unscale", **facts},
                    [Evidence("ValueError: attemting to unscale fp16 grads", 3)], likely=True)


def test_a_likely_finding_keeps_its_frame_through_a_merge():
    a = _likely("unscale-fp16-gradients")
    b = _likely("unscale-fp16-gradients", module="encoder")
    assert a.title.startswith("Likely: ") and "likely cause, not a certain one" in a.explanation
    merged, = merge_findings([a, b], BY_ID, same_sighting=True)
    assert merged.likely
    assert merged.title.startswith("Likely: ")
    assert "likely cause, not a certain one" in merged.explanation
    assert merged.severity == "warning"


def test_a_certain_sighting_of_the_same_cause_makes_the_guess_certain():
    guess = _likely("unscale-fp16-gradients")
    sure = assemble(BY_ID["unscale-fp16-gradients"], {}, [Evidence("ValueError: Attempting to unscale FP16 gradients.", 9)])
    merged, = merge_findings([guess, sure], BY_ID, same_sighting=True)
    assert not merged.likely and not merged.title.startswith("Likely")
    assert "likely cause" not in merged.explanation
    assert merged.severity == "error"


def test_a_guess_never_shows_a_cut_title():
    rule = BY_ID["accelerate-removed-kwarg"]
    f = assemble(rule, {"likely": "60%", "shared_words": "accelerator, keyword"}, likely=True)
    assert f.title.startswith("Likely: ")
    assert "…" not in f.title and not f.title.rstrip().endswith("`")


# --- words only from rules ---------------------------------------------------------------------

def _rerendered(f):
    rule = BY_ID[f.rule]
    facts = f.all_facts if f.all_facts is not None else f.facts
    return assemble(rule, facts, f.evidence, count=f.count, ranks=f.ranks, likely=f.likely,
                    refinements=f.refinements)


def _same_words(f) -> None:
    fresh = _rerendered(f)
    assert (f.title, f.explanation, f.fixes) == (fresh.title, fresh.explanation, fresh.fixes), f.rule


def test_every_finding_of_every_face_rerenders_from_its_rule_and_facts():
    """No face edits a finding's words after its rule rendered them: each finding (log,
    env, run, probe; sharpened and likely ones included) is what its rule says on its facts."""
    from mpdoctor.diagnosis.probe import probe_case
    from mpdoctor.diagnosis.run import events_case
    from mpdoctor.env.judge import snapshot_case
    from mpdoctor.logs import explain_path

    seen: set[str] = set()
    for path in sorted((ROOT / "fixtures" / "logs" / "real").glob("*.log")):
        for f in explain_path(str(path), RULES).findings:
            _same_words(f)
            seen.add("log")
    for path in sorted(SNAPS.glob("*.json")):
        for f in snapshot_case(str(path), RULES):
            _same_words(f)
            seen.add("env")
    for path in sorted((ROOT / "fixtures" / "events").glob("*.json")):
        if "processes" not in json.loads(path.read_text()):
            continue  # an allocator recording, not a run
        for f in events_case(str(path), RULES):
            _same_words(f)
            seen.add("run")
    for path in sorted((ROOT / "fixtures" / "probe").glob("*.json")):
        for f in probe_case(str(path), RULES):
            _same_words(f)
            seen.add("probe")
    assert seen == {"log", "env", "run", "probe"}


def test_a_sharpened_finding_rerenders_from_its_rules(tmp_path):
    from mpdoctor.diagnosis.sharpen import sharpen_with
    from mpdoctor.logs import explain_text

    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 1.12 GiB is free.\n")
    report = explain_text(text, RULES)
    sharpen_with(report, json.loads((SNAPS / "rtx4090-fp32-no-config.json").read_text()), "test", RULES)
    top = report.findings[0]
    assert "native bf16; the run looks like fp32" in top.explanation
    assert top.fixes[0].startswith("Train in bf16 on this NVIDIA GeForce RTX 4090")
    _same_words(top)


def test_the_rank_summary_and_precision_plan_are_said_by_their_rules():
    from mpdoctor.diagnosis.run import events_case

    found = {f.rule: f for f in events_case(str(ROOT / "fixtures" / "events" / "two-ranks-rank1-fails.json"), RULES)}
    summary = found["rank-summary"]
    assert summary.title.startswith("Rank 1 failed first in `encoder` at step 2; rank 0 waited in ")
    plan = found["precision-plan"]
    assert plan.explanation.startswith("Requested no; the first matmul ran in float32;")
    assert "Processes: MULTI_CPU × 2." in plan.explanation
    words = "\n".join(f.read_text() for f in sorted((ROOT / "mpdoctor" / "run" / "checks").glob("*.py")))
    assert "def rank_story" in words and "def precision_plan" in words
    for phrase in ("failed first", "lost its peer", "first matmul ran in", "fp32 master weights"):
        assert f'"{phrase}' not in words and f" {phrase}\"" not in words, phrase


def test_conclude_is_supersede_merge_rank():
    generic = assemble(BY_ID["unscale-fp16-gradients"], {}, [Evidence("x", 5)])
    specific = assemble(BY_ID["unscale-fp16-gradients-hf"], {}, [Evidence("y", 7)])
    again = assemble(BY_ID["unscale-fp16-gradients-hf"], {}, [Evidence("z", 9)])
    out = conclude([generic, specific, again], BY_ID)
    assert [f.rule for f in out] == ["unscale-fp16-gradients-hf"] and out[0].count == 2


def test_checks_name_no_rule_id_in_python():
    """What Python used to say by rule id is a rule key now (quiet, area, only_in_trouble)."""
    for path in (ROOT / "mpdoctor").rglob("*.py"):
        text = path.read_text()
        for rid in ("precision-plan", "torch-import-fails", "cuda-visible-devices-invalid"):
            assert f'"{rid}"' not in text, (path, rid)


def test_a_check_hands_codes_and_the_rule_says_them():
    rule = BY_ID["rank-summary"]
    story = [{"rank": 0, "status": "finished", "when": "step", "step": 3},
             {"rank": 1, "status": "waited_killed", "waited_in": "all_reduce", "when": "before_first", "step": -1}]
    f = assemble(rule, {"story": story, "_details": story, "ranks": 2})
    assert f.title == "rank 0 finished at step 3; rank 1 waited in all_reduce and was killed before the first step"
