"""Regular expressions against long runs of text: no super-linear backtracking.

    python bench/regex_bench.py            # all three parts; exit 1 if a pattern is slow

Timed, so a benchmark and not a test (a loaded machine slows one run and not the next):
the suite asserts the same property statically (engine/backtracking.py's checker, which
every rule file and every user rule passes) and by hang guards.

1. Every module-level pattern of logtext/, engine/ and logs/ against runs of 2 KB and 8 KB
   of each character class after each lead: a linear search takes ~4x as long on 4x the
   text, a quadratic one ~16x (flagged at >= 7x, best of three).
2. The detector itself flags the shapes that hung explain before (the old box-top and
   clause regexes) and not a linear one.
3. Every built-in rule pattern, as the matcher runs it (both cases), on lines of 2 KB and
   of MAX_MATCH_CHARS (8 KB) of one class or of its own fixed runs repeated.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import signal
import sys
import time

import mpdoctor.engine as engine_pkg
import mpdoctor.logtext as logtext_pkg
from mpdoctor import logs as logs_pkg
from mpdoctor import rulebase
from mpdoctor.logtext.lines import LazyRe


class _Slow(Exception):
    pass


def _timed(fn, limit: float) -> float:
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


def _module_patterns() -> dict[str, re.Pattern]:
    """Every module-level pattern (or tuple of them) in logtext/, engine/ and logs/."""
    mods = []
    for pkg in (logtext_pkg, engine_pkg, logs_pkg):
        for m in pkgutil.iter_modules(pkg.__path__):
            if m.name != "derive":
                mods.append(importlib.import_module(f"{pkg.__name__}.{m.name}"))
    found: dict[str, re.Pattern] = {}

    def collect(name: str, obj, depth: int = 0) -> None:
        if isinstance(obj, LazyRe):
            found[name] = re.compile(*obj._args)
        elif isinstance(obj, re.Pattern):
            found[name] = obj
        elif isinstance(obj, (tuple, list)) and depth < 3:
            for i, x in enumerate(obj):
                collect(f"{name}[{i}]", x, depth + 1)

    for m in mods:
        for k, v in vars(m).items():
            collect(f"{m.__name__}.{k}", v)
    return found


UNITS = [" ", "\t", "─", "╭", "a", "A", "1", ".", ":", "-", "/", '"', "_", "a ", "(", "[", "\\", "|", "%",
         "File ", "Error: ", "\\n", "0;"]


def _families(src: str) -> list[tuple[str, str]]:
    """(lead, unit) pairs: a run of `unit` after `lead`, the leads being nothing, a letter
    and the pattern's own literal characters and words."""
    lits = sorted(set(re.findall(r"[A-Za-z]{2,}|[^\\\w\s()\[\]?*+{}|^$]", src)))
    leads = ["", "x"] + [c for c in lits if len(c) == 1][:4] + [w for w in lits if len(w) > 1][:2]
    units = UNITS + [w for w in lits if len(w) > 1][:3]
    return [(lead, u) for u in units for lead in leads]


def _superlinear(run, small: int, big: int, limit: float = 2.0) -> bool:
    """Whether run(n) grows faster than linearly from n=small to n=big (4x): a linear
    search takes ~4x as long, a quadratic one ~16x, a catastrophic one never ends (cut
    off at `limit`). Suspects are timed again (best of three) before they count."""
    def best(n: int, tries: int) -> float:
        return min(_timed(lambda: run(n), limit) for _ in range(tries))

    try:
        t_big = best(big, 1)
        if t_big < 0.03:
            return False
        t_small = best(small, 1)
        if t_big / max(t_small, 1e-4) < 7:
            return False
        t_big, t_small = best(big, 3), best(small, 3)
        return t_big >= 0.03 and t_big / max(t_small, 1e-4) >= 7
    except _Slow:
        return True



def module_patterns_linear() -> list:
    slow = []
    patterns = _module_patterns()
    for name, rx in patterns.items():
        src = rx.pattern if isinstance(rx.pattern, str) else rx.pattern.decode("latin-1")
        for lead, unit in _families(src):
            def run(n: int, lead=lead, unit=unit, rx=rx) -> None:
                s = lead + unit * (n // len(unit)) + "\x01"
                rx.search(s.encode() if isinstance(rx.pattern, bytes) else s)

            if _superlinear(run, 2048, 8192):
                slow.append((name, lead, unit))
    print(f"1. {len(patterns)} module patterns: {len(slow)} super-linear {slow[:10]}")
    return slow


def fuzz_finds_what_it_is_for() -> bool:
    box_top = re.compile(r"^\s*[╭┏╔]─*\s*(?P<title>.*?)\s*─*[╮┓╗]\s*$")  # the old box-top regex
    clause = re.compile(r"\s*(?:[(\[:;,]|\s-\s|\.\s)")  # the old clause regex (finditer)
    ok = (_superlinear(lambda n: box_top.search("╭" + " " * n + "x"), 2048, 8192, limit=0.3)
          and _superlinear(lambda n: list(clause.finditer(" " * n)), 1024, 4096)
          and not _superlinear(lambda n: re.search(r"Traceback \(most", " " * n), 2048, 8192))
    print(f"2. the detector flags the old hangs and not a linear pattern: {ok}")
    return ok


def rule_patterns_bounded() -> dict:
    from mpdoctor.logtext import MAX_MATCH_CHARS

    rules = [r for r in rulebase.load() if r.kind == "log"]
    slow: dict[str, str] = {}
    n = 0
    for rule in rules:
        for key in ("patterns", "unless", "requires", "excludes", "context"):
            for lp in getattr(rule, key):
                n += 1
                fams = [" ", "a", "_", ".", '"']
                fams += [alt + " " for step in lp.runs for alt in step][:3]
                joined = " ".join(step[0] for step in lp.runs)
                if joined:
                    fams.append(joined + " ")
                for flags in (0, re.IGNORECASE):
                    rx = re.compile(lp.pattern, flags)
                    for unit in fams:
                        def run(k: int, unit=unit, rx=rx) -> None:
                            rx.search((unit * (k // max(1, len(unit)) + 1))[:k])

                        if rule.id not in slow and _superlinear(run, MAX_MATCH_CHARS // 4, MAX_MATCH_CHARS):
                            slow[rule.id] = f"{key} {lp.pattern[:80]!r} on {unit[:20]!r}"
    print(f"3. {n} rule patterns: {len(slow)} backtrack on a long line {slow}")
    return slow


def main() -> int:
    bad = bool(module_patterns_linear()) | (not fuzz_finds_what_it_is_for()) | bool(rule_patterns_bounded())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
