"""One probe mode judged by the rule base: the probe rules over its measurements, and,
through diagnosis.run, the run rules over what the watch saw and the env rules over the
environment the mode's child ran in (with what the probe measured as observed facts).
A failed mode's stderr is read by the log rules, as `explain` would read it. The probe
face (mpdoctor/probe/) runs the modes and is handed a ModeJudge; `run_probe*` here compose
the two for the commands."""

from __future__ import annotations

import json
import os
from typing import Any

from ..engine.assemble import conclude
from ..engine.judge import checks_of, judge_rules
from ..engine.rule import Rule
from ..findings import Finding
from ..probe import checks as probe_checks
from ..probe.evidence import ProbeView, read_probe_evidence


def _checks() -> dict[str, Any]:
    return checks_of(probe_checks)


def tagged(f: Finding, mode: str) -> Finding:
    """Every probe finding says which mode's run it rests on (facts.mode)."""
    if f.facts.get("mode") != mode:
        f.facts = {"mode": mode, **{k: v for k, v in f.facts.items() if k != "mode"}}
    return f


def judge_failed_mode(mode: str, stderr: str, rules: list[Rule],
                      env: dict[str, Any] | None = None) -> tuple[list[Finding], list[str]]:
    """A mode whose child failed: its stderr by the log rules and, where the environment
    another mode's child ran in is known (`env`, the same machine), the precision rules
    of the environment asked for this mode: the same plan `check` judges, so fp8 on a CPU
    is "no GPU" here as there, not "install an fp8 backend"."""
    if not stderr.strip():
        return [], []
    from ..logs import explain_text

    report = explain_text(stderr, rules, extra_facts={"mode": mode})
    findings = list(report.findings) + _env_precision_findings(mode, env, rules)
    by_id = {r.id: r for r in rules}
    findings = conclude(findings, by_id, same_sighting=True)
    return [_as_trial(tagged(f, mode)) for f in findings], [u.exception for u in report.unrecognised]


def _env_precision_findings(mode: str, env: dict[str, Any] | None, rules: list[Rule]) -> list[Finding]:
    """The env rules of the precision categories over `env`, judged for `mode`."""
    if not env or mode not in ("fp16", "bf16", "fp8"):
        return []
    from ..env import SnapshotError, load_snapshot_data
    from ..env.judge import PRECISION_CATEGORIES, judge

    try:
        snapshot = load_snapshot_data({"schema": 1, **env}, live=True)
    except SnapshotError:
        return []
    report = judge(snapshot, mixed_precision=mode, rules=rules, source=f"probe.{mode}.env",
                   requested_from=f"the probe's {mode} mode")
    return [f for f in report.findings if f.category in PRECISION_CATEGORIES]


def judge_mode(evidence: dict[str, Any], rules: list[Rule], stderr: str = "") -> list[Finding]:
    from .run import judge_run

    view = ProbeView(evidence)
    by_id = {r.id: r for r in rules}
    findings = [f for o in judge_rules(view, [r for r in rules if r.kind == "probe"], _checks()) for f in o.findings]
    observed = {"speedup": f"{view.speedup:.2f}x" if view.speedup is not None else None,
                "torch_autocast_fp16_dtype": (view.result.get("torch_autocast_fp16") or {}).get("autocast_dtype")}
    watch = view.observed.get("watch") or {}
    run_evidence = {"schema": 1, "command": ["mpdoctor probe"], "exit_code": 0, "signal": None, "output": {},
                    "processes": [{"rank": None, "pid": None, "world_size": None, "env": view.result.get("env") or {},
                                   "watch": watch, "exceptions": [], "exit": {}, "progress": None,
                                   "internal_errors": []}]}
    run = judge_run(run_evidence, rules, output=stderr, observed={k: v for k, v in observed.items() if v},
                    requested_from=f"the probe's {view.mode} mode")
    # the precision summary: the probe's own table says it
    findings += [f for f in run.findings if not (f.rule in by_id and by_id[f.rule].only_in_trouble)]
    return [_as_trial(tagged(f, view.mode)) for f in conclude(findings, by_id, same_sighting=True)]


def _as_trial(f: Finding) -> Finding:
    """A probed mode is a trial the user did not ask to train in: what goes wrong in it
    is a warning about that mode, not an error of the user's setup."""
    if f.severity == "error":
        f.severity = "warning"
    return f


def save_evidence(evidence: dict[str, Any]) -> None:
    """MPDOCTOR_SAVE_PROBE=DIR keeps each mode's evidence (how fixtures/probe/ was made)."""
    folder = os.environ.get("MPDOCTOR_SAVE_PROBE")
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        # a file mpdoctor writes: no secret in it
        from ..redact import redact_record

        with open(os.path.join(folder, f"probe-{evidence['mode']}.json"), "w", encoding="utf-8") as fh:
            json.dump(redact_record(evidence), fh, indent=1, default=str)
    except OSError:
        pass


def probe_case(path: str, rules: list[Rule]) -> list[Finding]:
    """How `rules test` judges an example that is a probe mode's recorded evidence."""
    return judge_mode(read_probe_evidence(path), rules)


class ModeJudge:
    """How the probe's parent judges its modes (handed to probe.rows.build_rows): a failed
    mode's stderr by the log rules, a mode that trained by the probe, run and env rules,
    each mode's evidence kept where MPDOCTOR_SAVE_PROBE says."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.env: dict[str, Any] | None = None  # the environment a mode's child ran in (this machine)

    def failed(self, mode: str, stderr: str) -> tuple[list[Finding], list[str]]:
        return judge_failed_mode(mode, stderr, self.rules, self.env)

    def mode(self, evidence: dict[str, Any], stderr: str = "") -> list[Finding]:
        if self.env is None:
            env = (evidence.get("result") or {}).get("env")
            self.env = env if isinstance(env, dict) and env else None
        return judge_mode(evidence, self.rules, stderr)

    def save(self, evidence: dict[str, Any]) -> None:
        save_evidence(evidence)


def run_probe(opts: Any, progress: Any = None, rules: list[Rule] | None = None) -> Any:
    """The probe, judged: the probe face runs every mode, the rule base judges each."""
    from .. import probe

    return probe.run_probe(opts, progress, ModeJudge(rules if rules is not None else _rules(opts)))


def run_probe_with_progress(opts: Any, *, progress: bool = True, rules: list[Rule] | None = None) -> Any:
    from .. import probe

    return probe.run_probe_with_progress(opts, ModeJudge(rules if rules is not None else _rules(opts)),
                                         progress=progress)


def run_probe_for_check(snapshot: dict[str, Any] | None = None, opts: Any = None, *, progress: bool = True,
                        rules: list[Rule] | None = None) -> dict[str, Any]:
    from .. import probe

    opts = opts or probe.ProbeOptions()
    return probe.run_probe_for_check(snapshot, opts, ModeJudge(rules if rules is not None else _rules(opts)),
                                     progress=progress)


def _rules(opts: Any) -> list[Rule]:
    from ..rulebase import load

    return load(getattr(opts, "rules", None) or None)
