"""`mpdoctor explain`: log text in, ranked findings out.

Pure Python over text: this module (and everything it imports) never imports torch,
accelerate, numpy or pynvml, which is what keeps `explain` fast and usable on a
machine where those are broken.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from .scan import Progress

from .engine.match import LogMatcher
from .engine.rule import Rule
from .findings import Report
from .logtext import LogLine, normalise, segment
from .scan import read_log

# The matcher of the last few rule lists (the list is kept, so its id stays its own).
_MATCHERS: dict[int, tuple[list[Rule], LogMatcher]] = {}


def matcher_for(rules: list[Rule]) -> LogMatcher:
    entry = _MATCHERS.get(id(rules))
    if entry is None or entry[0] is not rules:
        if len(_MATCHERS) > 32:
            _MATCHERS.clear()
        entry = (rules, LogMatcher(rules))
        _MATCHERS[id(rules)] = entry
    return entry[1]


def explain_lines(lines: list[LogLine], rules: list[Rule], extra_facts: dict[str, Any] | None = None) -> Report:
    tracebacks = segment(lines)
    findings, unrecognised = matcher_for(rules).findings(lines, tracebacks, extra_facts)
    return Report(findings=findings, unrecognised=unrecognised)


def explain_text(text: str, rules: list[Rule] | None = None, extra_facts: dict[str, Any] | None = None) -> Report:
    """Explain a log held in memory (the run wrapper's tail, a rule's example, an
    exception a run recorded). `extra_facts`: what another face observed around the
    text (the module that raised it), for the templates."""
    if rules is None:
        from .rulebase import load

        rules = load()
    report = explain_lines(normalise(text), rules, extra_facts)
    report.input = {"bytes": len(text.encode("utf-8", "replace")), "lines": text.count("\n") + 1}
    return report


def explain_path(path: "str | Path", rules: list[Rule] | None = None, progress: Progress | None = None) -> Report:
    """Explain a file (or '-' for stdin) of any size. Raises scan.InputError.

    `progress(bytes_read, total)` is called while a big log is being read."""
    if rules is None:
        from .rulebase import load

        rules = load()
    matcher = matcher_for(rules)
    log = read_log(str(path), matcher.prefilter, progress)
    lines: list[LogLine] = []
    for first_no, text in log.regions:
        lines.extend(normalise(text, first_no))
    report = explain_lines(lines, rules)
    report.input = log.info
    return report


def explain_case(rule: Rule, example: Any, rules: list[Rule]) -> list[Any]:
    """How `mpdoctor rules test` judges a log rule's example: as `explain` would."""
    from .engine.selftest import example_text

    return explain_text(example_text(rule, example), rules).findings
