"""Log text in, ranked findings out: the entry points every face uses.

Pure Python over text: this module (and everything it imports) never imports torch,
accelerate, numpy or pynvml, which is what keeps `explain` fast and usable on a
machine where those are broken.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from .prefilter import Prefilter
    from .read import Progress

from ..engine.match import LogMatcher
from ..engine.rule import Rule
from ..findings import Report
from ..logtext import LogLine, normalise, segment
from .read import read_log

# The matcher (and big-log prefilter, once built) of the last few rule lists; the list
# is kept, so its id stays its own.
_MATCHERS: dict[int, list] = {}


def _entry(rules: list[Rule]) -> list:
    entry = _MATCHERS.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_MATCHERS) > 32:
            _MATCHERS.clear()
        entry = [rules, LogMatcher(rules), None]
        _MATCHERS[id(rules)] = entry
    return entry


def matcher_for(rules: list[Rule]) -> LogMatcher:
    return _entry(rules)[1]


def prefilter_for(rules: list[Rule]) -> Prefilter:
    """What a streaming scan of a big log must keep for these rules (prefilter.py), built
    on first use: only a log too big to read whole needs it."""
    entry = _entry(rules)
    if entry[2] is None:
        from .prefilter import build_prefilter

        entry[2] = build_prefilter(entry[1].rules)
    return entry[2]


def explain_lines(lines: list[LogLine], rules: list[Rule], extra_facts: dict[str, Any] | None = None) -> Report:
    tracebacks = segment(lines)
    findings, unrecognised = matcher_for(rules).findings(lines, tracebacks, extra_facts)
    if findings:  # severity from context: what the log shows was survived is information
        from ..engine.survived import lower_survived
        from ..findings import rank_findings

        findings = rank_findings(lower_survived(findings, lines, tracebacks))
    return Report(findings=findings, unrecognised=unrecognised)


def explain_text(text: str, rules: list[Rule], extra_facts: dict[str, Any] | None = None) -> Report:
    """Explain a log held in memory (the run wrapper's tail, a rule's example, an
    exception a run recorded). `extra_facts`: what another face observed around the
    text (the module that raised it), for the templates."""
    report = explain_lines(normalise(text), rules, extra_facts)
    report.input = {"bytes": len(text.encode("utf-8", "replace")), "lines": text.count("\n") + 1}
    return report


def explain_path(path: "str | Path", rules: list[Rule], progress: Progress | None = None) -> Report:
    """Explain a file (or '-' for stdin) of any size. Raises read.InputError.

    `progress(bytes_read, total)` is called while a big log is being read."""
    log = read_log(str(path), lambda: prefilter_for(rules), progress)
    lines: list[LogLine] = []
    for first_no, text in log.regions:
        lines.extend(normalise(text, first_no))
    report = explain_lines(lines, rules)
    report.input = log.info
    return report


def explain_case(rule: Rule, example: Any, rules: list[Rule]) -> list[Any]:
    """How `mpdoctor rules test` judges a log rule's example: as `explain` would."""
    from ..engine.selftest import example_text

    return explain_text(example_text(rule, example), rules).findings
