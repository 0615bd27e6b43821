"""Issue 19 item 3: one question, one answer. The precision plan of `check`, the machine
facts of `explain --snapshot/--here`, a failed probe mode and a run's recorded plan say
the same thing about the same machine, and no face advises a mode that the plan says
cannot run here. Fast: recorded snapshots and events, the faces' own entry points."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.cli import main
from mpdoctor.knowledge import intent

ROOT = Path(__file__).resolve().parent.parent
SNAPS = ROOT / "fixtures" / "snapshots"
EVENTS = ROOT / "fixtures" / "events"
RULES = rulebase.load()

# accelerate 1.16's own message when fp8 is asked for without a backend (state.py)
FP8_LOG = """Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 5, in <module>
    accelerator = Accelerator(mixed_precision="fp8")
  File "/usr/lib/python3.11/site-packages/accelerate/state.py", line 895, in __init__
    raise ValueError(
ValueError: Using `fp8` precision requires `transformer_engine` or `torchao` to be installed.
"""


def cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue()


def check_json(snapshot: Path) -> dict:
    return json.loads(cli("check", "--snapshot", str(snapshot), "--format", "json")[1])


def _with_env(tmp_path: Path, name: str, **env: str) -> Path:
    data = json.loads((SNAPS / f"{name}.json").read_text())
    data["env"] = {**(data.get("env") or {}), **env}
    out = tmp_path / f"{name}-env.json"
    out.write_text(json.dumps(data))
    return out


def _mentions_fp16(texts: list[str]) -> bool:
    return any("fp16" in t.replace("fp16 on a CPU", "") for t in texts)


# --- fp8 on a CPU: check, explain --snapshot and a failed probe mode agree --------------------

def test_check_fp8_on_cpu_names_bf16_and_says_fp8_cannot_run():
    data = check_json(SNAPS / "cpu-fp8.json")
    f = next(f for f in data["findings"] if f["rule"] == "fp8-below-sm89")
    assert f["severity"] == "error"
    assert "no GPU is in use" in f["title"]
    assert f["fixes"][0].startswith("Train in bf16, which runs on this machine")
    assert not _mentions_fp16(f["fixes"])
    plan = data["precision_plan"]
    assert plan["launch_runs_as"] == "cannot run"
    _, text = cli("check", "--snapshot", str(SNAPS / "cpu-fp8.json"))
    assert "`accelerate launch` trains in nothing (fp8 cannot run here)" in text
    assert "trains in fp8" not in text


def test_explain_snapshot_fp8_on_cpu_gives_the_machines_fix_only(tmp_path):
    log = tmp_path / "fp8.log"
    log.write_text(FP8_LOG)
    rc, out = cli("explain", str(log), "--snapshot", str(SNAPS / "cpu-fp8.json"), "--format", "json")
    f = json.loads(out)["findings"][0]
    assert f["category"] == "fp8-unsupported"
    assert "no GPU is in use" in f["explanation"]
    # the machine settles it: installing torchao would not make fp8 run on a CPU, and fp16 runs as fp32 here
    assert f["fixes"][0].startswith("Train in bf16, which runs on this machine")
    assert not any("pip install torchao" in x for x in f["fixes"])
    assert not _mentions_fp16(f["fixes"])


def test_explain_snapshot_fp8_on_a_gpu_without_backend_keeps_the_install_fix(tmp_path):
    # the look-alike: an H100 without TransformerEngine or torchao: the backend is the fix
    log = tmp_path / "fp8.log"
    log.write_text(FP8_LOG)
    _, out = cli("explain", str(log), "--snapshot", str(SNAPS / "h100-fp8-no-te.json"), "--format", "json")
    f = json.loads(out)["findings"][0]
    assert f["rule"] == "accelerate-fp8-backend-missing"
    assert any("pip install torchao" in x for x in f["fixes"])


def test_failed_probe_mode_fp8_on_cpu_is_the_same_finding_as_check():
    from mpdoctor.diagnosis.probe import judge_failed_mode

    snap = json.loads((SNAPS / "cpu-fp8.json").read_text())
    env = {k: snap[k] for k in ("torch", "packages", "env", "platform", "cpu")}
    findings, _ = judge_failed_mode("fp8", FP8_LOG, RULES, env)
    assert findings[0].rule == "fp8-below-sm89"
    assert findings[0].facts["mode"] == "fp8"
    assert not any(f.rule == "accelerate-fp8-backend-missing" for f in findings)
    assert not any("pip install torchao" in x for f in findings for x in f.fixes)
    # without the machine's environment, the log alone still speaks
    alone, _ = judge_failed_mode("fp8", FP8_LOG, RULES)
    assert alone[0].rule == "accelerate-fp8-backend-missing"


# --- check's plan: never "runs as fp32" and "trains in fp16" in one breath ---------------------

def test_check_plan_lines_say_what_trains_here(tmp_path):
    snap = _with_env(tmp_path, "dev-cpu-fp16", ACCELERATE_MIXED_PRECISION="fp16")
    _, text = cli("check", "--snapshot", str(snap))
    plan = text.split("Precision plan", 1)[1].split("Checklist", 1)[0]
    assert "runs as fp32" in plan
    assert "trains in fp32 here (it asks for fp16)" in " ".join(plan.split())
    assert "trains in fp16" not in " ".join(plan.split())
    data = check_json(snap)["precision_plan"]
    assert (data["launch_runs_as"], data["python_runs_as"]) == ("fp32", "fp32")


def test_check_plan_bf16_on_cpu_trains_in_bf16(tmp_path):
    snap = _with_env(tmp_path, "cpu-torch-on-gpu-bf16")
    data = check_json(snap)["precision_plan"]
    assert data["launch_runs_as"] == "bf16"


# --- a MULTI_GPU config on a machine without CUDA: check says it before run does ---------------

def test_check_multi_gpu_config_without_cuda_is_an_error_in_runs_words():
    rc, out = cli("check", "--snapshot", str(SNAPS / "cpu-multi-gpu-config.json"), "--format", "json")
    data = json.loads(out)
    assert rc == 1
    f = next(f for f in data["findings"] if f["rule"] == "multi-gpu-config-no-cuda")
    assert f["severity"] == "error" and f["category"] == "accelerate-config"
    assert "each would train alone" in f["title"]
    # the same family of words as run's processes-did-not-join
    run_rule = next(r for r in RULES if r.id == "processes-did-not-join")
    assert "trained alone" in run_rule.title
    assert "never joined" in " ".join(run_rule.explanation) or "never formed" in " ".join(run_rule.explanation)
    assert "never join" in f["explanation"]
    assert "`use_cpu: true`" in f["fixes"][0]


def test_check_multi_cpu_config_on_cpu_is_quiet():
    data = check_json(SNAPS / "lookalike" / "cpu-multi-cpu-config.json")
    assert not any(f["rule"] == "multi-gpu-config-no-cuda" for f in data["findings"])


# --- a run's recorded intent: every source, and which one won ---------------------------------

def _run_findings(name: str) -> list:
    from mpdoctor.diagnosis.run import events_case

    return events_case(str(EVENTS / f"{name}.json"), RULES)


def test_run_config_bf16_overridden_by_the_codes_no():
    findings = _run_findings("intent-config-bf16-code-no")
    top = findings[0]
    assert top.rule == "intent-code-overrides" and top.severity == "warning"
    assert top.facts["trained"] == "fp32" and top.facts["asked"] == "bf16"
    assert "intent_code_says_no.py:19" in top.title and "intent_bf16_config.yaml" in top.title
    plan = next(f for f in findings if f.rule == "precision-plan")
    assert "Asked for by: the accelerate config file bf16" in plan.explanation
    assert "Accelerator(mixed_precision=...) no (fixtures/scripts/scenarios/intent_code_says_no.py:19) — used" \
        in plan.explanation


def test_run_env_fp16_overridden_by_trainer_bf16():
    top = _run_findings("intent-env-fp16-trainer-bf16")[0]
    assert top.rule == "intent-code-overrides"
    assert top.title == "TrainingArguments(bf16=True) overrode ACCELERATE_MIXED_PRECISION=fp16: the run trained in " \
                        "bf16, not fp32"


def test_run_launch_flag_over_config_is_a_note():
    findings = _run_findings("intent-flag-bf16-config-fp16")
    f = next(f for f in findings if f.rule == "intent-flag-overrides-config")
    assert f.severity == "info"
    assert not any(f.rule == "intent-code-overrides" for f in findings)


def test_run_config_applied_says_no_override():
    findings = _run_findings("lookalike-intent-config-bf16-applied")
    assert not any(f.rule.startswith("intent-") for f in findings)


# --- the precedence table itself ---------------------------------------------------------------

@pytest.mark.parametrize("argv, want", [
    (["/venv/bin/accelerate", "launch", "--mixed_precision", "BF16", "t.py", "--mixed_precision", "fp16"],
     {"flag": "bf16", "config_file": None}),
    (["python", "-m", "accelerate.commands.launch", "--config-file=c.yaml", "t.py"],
     {"flag": None, "config_file": "c.yaml"}),
    (["accelerate", "env"], None),
    (["python", "train.py"], None),
])
def test_parse_launch_argv(argv, want):
    assert intent.parse_launch_argv(argv) == want


def test_precedence_code_over_launch_over_env():
    def src(*kinds):
        return [{"source": k, "value": "bf16"} for k in kinds]
    assert intent.winner(src(intent.ENV, intent.ACCELERATOR_ARG)) == intent.ACCELERATOR_ARG
    assert intent.winner(src(intent.CONFIG_FILE, intent.LAUNCH_FLAG)) == intent.LAUNCH_FLAG
    assert intent.winner(src(intent.ENV, intent.TRAINER_ARGS)) == intent.TRAINER_ARGS
    assert intent.runs_as("fp16", "cpu") == "no" and intent.runs_as("bf16", "cpu") == "bf16"


def test_config_precision_reads_yaml_and_json(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("compute_environment: LOCAL_MACHINE\nmixed_precision: BF16\nfsdp_config:\n  mixed_precision: fp16\n")
    assert intent.config_precision(str(y)) == "bf16"
    j = tmp_path / "c.json"
    j.write_text('{"mixed_precision": "fp16"}')
    assert intent.config_precision(str(j)) == "fp16"
    assert intent.config_precision(str(tmp_path / "missing.yaml")) is None


def test_probe_judge_keeps_the_machine_of_a_mode_that_ran_for_the_one_that_failed():
    # the probe's parent: the fp32 mode ran (its environment recorded), then fp8 failed
    from mpdoctor.diagnosis.probe import ModeJudge
    from mpdoctor.probe.evidence import read_probe_evidence

    judge = ModeJudge(RULES)
    judge.mode(read_probe_evidence(str(ROOT / "fixtures" / "probe" / "bf16-cpu.json")))
    assert judge.env and judge.env.get("torch")
    findings, _ = judge.failed("fp8", FP8_LOG)
    assert findings[0].rule == "fp8-below-sm89" and findings[0].severity == "warning"  # a trial mode
    assert findings[0].fixes[0].startswith("Train in bf16")
