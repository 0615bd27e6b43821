"""Bounded by construction (issue 13): hostile text costs `explain` time and memory in
proportion to what it keeps, never more.

- every built-in rule pattern passes the static backtracking checker user rules pass
  (the timed fuzz of every pattern on long runs is a benchmark: bench/regex_bench.py);
- a box border followed by 2 KB of spaces, 20,000 chained tracebacks, a log with a
  scan marker on every line: time and memory bounded;
- the pure-Python big-log scan finds every line a literal-by-literal scan finds, in far
  fewer passes.
"""

from __future__ import annotations

import signal
import time
import tracemalloc
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.fixedruns import runs_in_order
from mpdoctor.logs import explain_path, explain_text, matcher_for, prefilter_for, read
from mpdoctor.logs import regions as log_regions
from mpdoctor.logs.prefilter import TRIGGERS, Prefilter
from mpdoctor.logs.scan_python import PyLiteralFinder
from mpdoctor.logtext import normalise, segment
from mpdoctor.logtext.lines import LogLine

ROOT = Path(__file__).resolve().parent.parent


class _Slow(Exception):
    pass


def _timed(fn, limit: float) -> float:
    """fn()'s time in seconds, or raise _Slow past `limit` (re checks signals while it
    backtracks, so a catastrophic pattern is stopped, not waited for)."""
    def alarm(*_a):
        raise _Slow()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    t = time.perf_counter()
    try:
        fn()
        return time.perf_counter() - t
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _run_with_cutoff(fn, limit: float):
    """fn()'s result; _Slow past `limit` seconds (a hang guard, far above any load)."""
    out = []
    _timed(lambda: out.append(fn()), limit)
    return out[0]


def _builtin_sources() -> list[tuple[str, str, str]]:
    """(rule id, key, pattern) of every regex key of every built-in rule file, read from
    the TOML (not from the rule cache, which skips the checks of a file it has seen)."""
    from mpdoctor.engine.loader import _read_toml

    out = []
    for path in sorted((ROOT / "rules").rglob("*.toml")):
        data = _read_toml(path)
        for key in ("patterns", "unless", "requires", "excludes", "context"):
            value = data.get(key, [])
            for src in [value] if isinstance(value, str) else value:
                out.append((str(data.get("id")), key, src))
    return out


def test_every_builtin_rule_pattern_passes_the_checker_user_rules_pass():
    """No exemption for the built-in rules: each pattern, as the loader compiles it (tolerant
    form), passes check_bounded with the shape checks a user's rule gets."""
    from mpdoctor.engine.backtracking import check_bounded
    from mpdoctor.engine.patterns import PatternError, tolerant

    sources = _builtin_sources()
    assert len(sources) > 500
    refused = []
    for rid, key, src in sources:
        try:
            check_bounded(tolerant(src), shapes=True)
        except PatternError as exc:
            refused.append(f"{rid} {key} {src[:60]!r}: {str(exc)[:60]}")
    assert not refused, refused


def test_the_builtin_rule_folder_is_checked_like_a_users(tmp_path, monkeypatch):
    """A pattern that backtracks is refused in the built-in folder too (it was let through
    there, to be caught only by the slow fuzz below)."""
    from mpdoctor.engine import loader, rulecache
    from mpdoctor.engine.rule import RuleError
    from tests.rulekit import write_rule

    monkeypatch.setenv("MPDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    rulecache.reset()
    folder = tmp_path / "builtin"
    write_rule(folder, "slow", patterns=[r"FAILED (?P<p>\S{0,300}?(?P<e>[\w\-]{1,80}?))\.so"])
    monkeypatch.setattr(loader, "_builtin_rules_dir", lambda: str(folder))
    try:
        with pytest.raises(RuleError, match="two repetitions side by side"):
            loader.load_dir(folder)
    finally:
        rulecache.reset()


def test_a_box_corner_and_2kb_of_spaces(tmp_path):
    """51 s before: the box-top regex backtracked cubically. Its linearity is the fuzz
    test's (above); here the lines are read at all, with a cut-off far above any load
    (a hang guard, not a timing: _timed raises past it)."""
    for line in ("╭" + " " * 1990, "╭" + " " * 1990 + "x", "╭" + " " * 1990 + "│", "┏" + "\t" * 4000 + "╮x"):
        _timed(lambda line=line: normalise(line + "\n" + line), 30)
    path = tmp_path / "box.log"
    path.write_text(("╭" + " " * 1990 + "x\n") * 50)
    report = _run_with_cutoff(lambda: explain_path(path, rulebase.load()), 60)
    assert report.input["lines"] == 50


def test_a_rich_box_still_unwraps():
    text = ("╭───────── Traceback (most recent call last) ─────────╮\n"
            "│ /home/u/train.py:12 in main                          │\n"
            "╰──────────────────────────────────────────────────────╯\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    texts = [ln.text for ln in normalise(text)]
    assert texts[0] == "Traceback (most recent call last):"
    assert any(t.startswith("RuntimeError: CUDA error") for t in texts)


def _chain(n: int) -> list[LogLine]:
    lines = []
    for i in range(n):
        lines += [LogLine(3 * i + 1, "Traceback (most recent call last):"),
                  LogLine(3 * i + 2, f"RuntimeError: CUDA error: an illegal memory access was encountered {i}"),
                  LogLine(3 * i + 3, "The above exception was the direct cause of the following exception:")]
    return lines


def test_chained_tracebacks_are_linear():
    """20,000 links of one chain, each a hit: a walk back along the chain per hit was
    quadratic (47 s for 30,000 before)."""
    rules = rulebase.load()
    matcher = matcher_for(rules)
    lines = _chain(20_000)
    tracebacks = segment(lines)
    assert len(tracebacks) == 20_000 and tracebacks[-1].chained_from == 19_998
    # a hang guard, not a timing (the bound is measured in bench/regex_bench.py's companion,
    # bench/explain_bench.py): a quadratic walk would not end within it
    findings, unrecognised = _run_with_cutoff(lambda: matcher.findings(lines, tracebacks), 120)
    assert findings[0].rule == "cuda-illegal-memory-access" or findings
    assert not unrecognised  # the whole chain is explained


def _marker_log(path: Path, mb: int) -> None:
    line = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    with path.open("wb") as fh:
        chunk = line * (1_000_000 // len(line))
        for _ in range(mb):
            fh.write(chunk)


def test_memory_is_bounded_by_what_is_kept_not_by_the_log(tmp_path, monkeypatch):
    """A scan marker on every line of a 3 MB log (1.1 GB for 100 MB before): the kept
    regions are capped (head and tail; the middle dropped and counted), so memory is
    that of what is kept. Budgets made small here so that tracemalloc stays quick."""
    monkeypatch.setattr(log_regions, "CHUNK", 2 * 1024 * 1024)
    monkeypatch.setattr(read, "WHOLE_LIMIT", 1024 * 1024)
    monkeypatch.setattr(log_regions, "HEAD_BUDGET", 256 * 1024)
    monkeypatch.setattr(log_regions, "TAIL_BUDGET", 512 * 1024)
    path = tmp_path / "markers.log"
    _marker_log(path, 3)
    rules = rulebase.load()
    prefilter_for(rules)
    tracemalloc.start()
    try:
        report = explain_path(path, rules)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.input["scanned"] == "regions" and report.input["lines"] == 3 * (1_000_000 // 67)
    kept = report.input["bytes"] - report.input["dropped_bytes"]
    assert kept <= 256 * 1024 + 512 * 1024
    assert peak < 24 * 1024 * 1024, f"peak {peak / 2**20:.0f} MB"


def test_the_scanner_keeps_head_and_tail_of_one_region_that_never_ends():
    scanner = log_regions.RegionScanner(["zzz"])
    line = b"Error: x\n"
    for _ in range(20):
        scanner.feed(line * (log_regions.HEAD_BUDGET // len(line) // 4))
    regions = scanner.finish()
    assert len(regions) == 2
    (h_no, head), (t_no, tail) = regions
    assert h_no == 1 and len(head) <= log_regions.HEAD_BUDGET and len(tail) <= log_regions.TAIL_BUDGET
    assert t_no + tail.count(b"\n") - 1 == scanner.line_count  # the tail ends at the log's last line
    assert scanner.dropped_bytes == 20 * len(line) * (log_regions.HEAD_BUDGET // len(line) // 4) - len(head) - len(tail)


# -- the pure-Python scan ------------------------------------------------------------------

def _reference_lines(spec, buf: bytes) -> set[int]:
    """What a literal-by-literal scan keeps (the pure-Python scan before it was one pass):
    every line holding a literal whose pattern's runs are on it in the pattern's case,
    and the first line of each requires/excludes/context literal."""
    low = buf.lower()
    keep: set[int] = set()

    def line_of(i: int) -> int:
        return low.count(b"\n", 0, i)

    items = [(t.lower().encode(), None) for t in TRIGGERS]
    items += [(lit.lower().encode(), checks) for (lit, _c), checks in spec.checks.items()]
    for lit, checks in items:
        i = low.find(lit)
        while i >= 0:
            start = low.rfind(b"\n", 0, i) + 1
            end = low.find(b"\n", i)
            end = len(low) if end < 0 else end
            if checks is None or any(runs_in_order(low if c else buf, tuple(tuple(a.encode() for a in s) for s in runs),
                                                   start, end) for runs, c in checks):
                keep.add(line_of(i))
            i = low.find(lit, i + 1)
    for lit in spec.first_literals:
        i = low.find(lit.lower().encode())
        if i >= 0:
            keep.add(line_of(i))
    return keep


def _fixture_text(wrap: int | None) -> bytes:
    import textwrap

    text = "\n".join(p.read_text(errors="replace") for p in sorted((ROOT / "fixtures" / "logs").rglob("*.log"))[:120])
    if wrap:
        text = "\n".join(w for line in text.split("\n") for w in (textwrap.wrap(line, wrap) or [""]))
    return text.encode()


@pytest.mark.parametrize("repeat, wrap", [(1, None), (1, 60), (6, 60), (6, None)])
def test_python_scan_keeps_every_line_a_literal_by_literal_scan_keeps(monkeypatch, repeat, wrap):
    """Once (lines that do not repeat: one pass over the text) and six times over (the
    distinct line shapes are searched), also with pastes wrapped at 60 columns: the same
    lines as the reference scan, no fewer."""
    monkeypatch.setenv("MPDOCTOR_NO_HYPERSCAN", "1")
    spec = prefilter_for(rulebase.load())
    finder = PyLiteralFinder(spec)
    buf = _fixture_text(wrap) * repeat
    got = {buf.count(b"\n", 0, p) for p in finder.positions(buf)}
    want = _reference_lines(spec, buf)
    missing = sorted(want - got)
    assert not missing, [buf.split(b"\n")[i][:80] for i in missing[:5]]


def test_python_scan_of_a_training_log_is_a_few_passes(monkeypatch):
    """A training log (a few line shapes with other numbers): the trie regex reads the
    distinct shapes only, a few hundred bytes for 8 MB (the literal-by-literal scan made
    hundreds of passes over all of it; counted, not timed)."""
    import random

    rng = random.Random(5)
    lines = [f"[rank0]: step {i:>8} | loss {rng.random() * 3:.4f} | lr 2.9e-04 | grad_norm {rng.random():.3f}"
             for i in range(100_000)]
    buf = ("\n".join(lines) + "\n").encode()
    finder = PyLiteralFinder(prefilter_for(rulebase.load()))
    searched: list[int] = []
    hits = finder._hits
    monkeypatch.setattr(finder, "_hits", lambda text: (searched.append(len(text)), hits(text))[1])
    assert set(finder.positions(buf)) <= {0}  # a context literal's first sighting ("[rank0]") only
    assert len(searched) == 1 and searched[0] < 1000, searched


def test_digits_masked_for_the_shapes_do_not_invent_or_lose_hits():
    spec = Prefilter(["fp16 overflow"])
    finder = PyLiteralFinder(spec)
    buf = b"".join([b"step 1 fp32 overflow\n"] * 50 + [b"step 2 fp16 overflow\n"] + [b"step 3 fp32 overflow\n"] * 50)
    got = sorted({buf.count(b"\n", 0, p) for p in finder.positions(buf)})
    assert got == [50]


def test_explain_text_of_many_chained_tracebacks_through_normalise():
    text = "".join(f"Traceback (most recent call last):\n  File \"t.py\", line {i}, in f\n"
                   f"ValueError: bad {i}\n\nDuring handling of the above exception, another exception occurred:\n\n"
                   for i in range(3000))
    report = _run_with_cutoff(lambda: explain_text(text, rulebase.load()), 120)  # a hang guard, not a timing
    assert report.findings or report.unrecognised
