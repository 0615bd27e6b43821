"""A job judged as one: the log rules' findings of every rank, and the job rules over the
merged per-rank evidence (who failed first and what the others saw, collectives that
differ across ranks, nodes that differ), through the one conclusion step. The job's
first failure comes first."""

from __future__ import annotations

from typing import Any

from ..engine.assemble import conclude
from ..engine.judge import checks_of, judge_rules
from ..findings import Finding, Report, Unrecognised
from . import checks as job_checks
from .view import JobView

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..engine.rule import Rule

def _checks() -> dict[str, Any]:
    return checks_of(job_checks)


def judge_job(data: dict[str, Any], rules: list[Rule], log_findings: list[Finding] | None = None,
              unrecognised: list[Unrecognised] | None = None) -> Report:
    by_id = {r.id: r for r in rules}
    view = JobView(data)
    job_rules = [r for r in rules if r.kind == "job"]
    found = [f for o in judge_rules(view, job_rules, _checks()) for f in o.findings]
    findings = conclude(list(log_findings or []) + found, by_id)
    first = view.first_failure()
    first_rank = first[0]["rank"] if first else None

    def order(f: Finding) -> int:
        rule = by_id.get(f.rule)
        if rule is not None and rule.kind == "job" and f.severity == "error":
            return 0
        if first_rank is not None and first_rank in f.ranks and not f.consequence and f.severity == "error":
            return 1
        return 2

    findings = sorted(findings, key=order)  # stable: conclude's ranking within each
    merged_unknown: list[Unrecognised] = []
    for u in unrecognised or []:
        same = next((m for m in merged_unknown if m.exception == u.exception), None)
        if same is None:
            merged_unknown.append(u)
        else:
            same.ranks = sorted(set(same.ranks) | set(u.ranks))
            same.count += u.count
    extra: dict[str, Any] = {"job": _job_summary(view, first)}
    report = Report(findings=findings, unrecognised=merged_unknown, extra=extra)
    report.quiet_rules = {r.id for r in rules if r.quiet}
    return report


def _job_summary(view: JobView, first: tuple[dict[str, Any], str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": len(view.ranks),
                           "nodes": sorted({r.get("node") for r in view.ranks if r.get("node")} |
                                           {n["node"] for n in view.nodes})}
    if first is not None:
        rank, how = first
        out["first_failure"] = {k: v for k, v in {"rank": rank["rank"], "node": rank.get("node") or rank.get("host"),
                                                   "how": how, "cause": JobView.cause_of(rank)}.items()
                                if v is not None}
    if view.collectives:
        out["collectives"] = len(view.collectives)
    return out


def job_case(path: str, rules: list[Rule]) -> list[Finding]:
    """How `rules test` judges a job rule's example: a job's recorded evidence (JSON)."""
    import json

    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return judge_job(data, rules).findings
