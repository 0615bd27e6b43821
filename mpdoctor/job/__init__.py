"""A job read as one: many ranks' logs, many nodes' run reports, Flight Recorder dumps.

    files, folders, globs ─► sources (rank and node from layout, names) ─► each log through
    the log pipeline ─► the job's evidence (JSON: per rank, per node, the collectives)
    ─► the job rules (rules/job/) ─► the one conclusion step, first failure first

Rooms: `sources` (which files, whose), `read` (reading them into the evidence), `flight`
(Flight Recorder dumps, read safely), `stacks` (a hang's per-rank stacks), `nodes` (run
reports of several nodes), `view` and `checks` (what the job rules judge), `judge`.
Pure Python over text and JSON: no torch.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..engine.rule import Rule
    from ..findings import Report


def explain_job(paths: list[str], rules: list[Rule], progress: Any = None) -> Report:
    """The job's report from its files (raises sources.SourceError on a path that cannot be read)."""
    from .judge import judge_job
    from .read import read_job

    reader = read_job(paths, rules, progress)
    report = judge_job(reader.evidence(), rules, reader.findings, reader.unrecognised)
    report.input = {"paths": list(paths), "sources": len(reader.sources), "bytes": reader.bytes}
    return report
