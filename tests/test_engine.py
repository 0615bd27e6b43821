"""The rule engine with tiny rule folders: literals, the keys of a rule, ranking, counts;
and reading big logs as regions (both scan engines) giving the findings of reading
them whole."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.engine.assemble import assemble
from mpdoctor.engine.selftest import run_selftest
from mpdoctor.logs import explain_path, explain_text, read
from mpdoctor.logs import regions as log_regions
from tests.rulekit import private_cache, rules_in, write_rule  # noqa: F401 (private_cache is an autouse fixture)

ROOT = Path(__file__).resolve().parent.parent
FORMS = ROOT / "fixtures" / "logs" / "forms"


def ids(report):
    return [f.rule for f in report.findings]


def test_a_literal_inside_another_rules_literal_is_not_hidden(tmp_path):
    rules = rules_in(tmp_path, ("short-one", {"patterns": ["of memory"]}),
                     ("long-one", {"patterns": [r"CUDA out of memory\. Tried"], "priority": 70}))
    assert set(ids(explain_text("RuntimeError: CUDA out of memory. Tried to allocate", rules))) == \
        {"short-one", "long-one"}


def test_patterns_compile_only_for_lines_with_their_literal(tmp_path):
    rules = rules_in(tmp_path, ("seen-rule", {"patterns": ["SEEN FAILED"]}),
                     ("unseen-rule", {"patterns": ["UNSEEN FAILED"]}))
    explain_text("x SEEN FAILED y", rules)
    by_id = {r.id: r for r in rules}
    assert by_id["seen-rule"].patterns[0]._rx is not None
    assert by_id["unseen-rule"].patterns[0]._rx is None


def test_unless_requires_excludes_context_min_count(tmp_path):
    rules = rules_in(
        tmp_path,
        ("with-unless", {"patterns": ["DISK FAILED"], "unless": ["retrying"]}),
        ("with-requires", {"patterns": ["NET FAILED"], "requires": [r"mixed_precision: fp16"]}),
        ("with-excludes", {"patterns": ["GPU FAILED"], "excludes": [r"dry run"]}),
        ("with-context", {"patterns": ["CPU FAILED"], "context": [r"world_size=(?P<world>\d+)"],
                          "title": "CPU failed on {world} ranks"}),
        ("twice-needed", {"patterns": ["FLAKY FAILED"], "min_count": 2}),
    )
    log = ("world_size=8\nmixed_precision: fp16\nDISK FAILED, retrying\nNET FAILED\nGPU FAILED\ndry run\n"
           "CPU FAILED\nFLAKY FAILED\n")
    report = explain_text(log, rules)
    assert set(ids(report)) == {"with-requires", "with-context"}
    assert [f.title for f in report.findings if f.rule == "with-context"] == ["CPU failed on 8 ranks"]
    assert "twice-needed" in ids(explain_text(log + "FLAKY FAILED again\n", rules))


def test_ranking_severity_consequence_priority_and_supersedes(tmp_path):
    rules = rules_in(
        tmp_path,
        ("wrapper-rule", {"patterns": ["WRAPPER FAILED"], "consequence": True, "priority": 90}),
        ("cause-rule", {"patterns": ["CAUSE FAILED"], "priority": 40}),
        ("better-cause", {"patterns": ["BETTER FAILED"], "priority": 80}),
        ("just-info", {"patterns": ["NOTE FAILED"], "severity": "info", "priority": 99}),
        ("generic-rule", {"patterns": ["SPECIFIC FAILED"]}),
        ("specific-rule", {"patterns": ["SPECIFIC FAILED"], "supersedes": ["generic-rule"]}),
    )
    log = "NOTE FAILED\nWRAPPER FAILED\nCAUSE FAILED\nBETTER FAILED\nSPECIFIC FAILED\n"
    assert ids(explain_text(log, rules)) == ["better-cause", "specific-rule", "cause-rule", "wrapper-rule", "just-info"]


def test_a_wrapper_in_a_chained_exception_ranks_below_its_cause(tmp_path):
    rules = rules_in(tmp_path, ("cause-rule", {"patterns": ["DEEP FAILED"], "priority": 30}),
                     ("re-raise", {"patterns": ["step failed, see above"], "priority": 90}))
    log = ("Traceback (most recent call last):\n  File \"/a/t.py\", line 3, in f\n    g()\n"
           "RuntimeError: DEEP FAILED here\n\n"
           "The above exception was the direct cause of the following exception:\n\n"
           "Traceback (most recent call last):\n  File \"/a/t.py\", line 9, in <module>\n    f()\n"
           "RuntimeError: step failed, see above\n")
    report = explain_text(log, rules)
    assert ids(report) == ["cause-rule", "re-raise"]
    assert report.findings[1].consequence is True
    assert report.findings[0].facts["user_frame"] == "/a/t.py:3"


def test_severity_fact_and_templates_leave_out_unknown_facts(tmp_path):
    rules = rules_in(tmp_path, ("templated", {
        "patterns": [r"TEMPLATED FAILED(?: code (?P<code>\d+))?(?: (?P<severity>warning))?"],
        "title": "Failed with code {code}", "explanation": ["Code {code}.", "Always said."],
        "fixes": ["Fix {code}.", "Generic fix."]}))
    f = explain_text("TEMPLATED FAILED", rules).findings[0]
    assert (f.title, f.explanation, f.fixes) == ("Failed with code", "Always said.", ["Generic fix."])
    f = explain_text("TEMPLATED FAILED code 7 warning", rules).findings[0]
    assert (f.title, f.explanation, f.fixes, f.severity) == ("Failed with code 7", "Code 7. Always said.",
                                                            ["Fix 7.", "Generic fix."], "warning")


def test_same_message_on_many_ranks_is_one_finding_with_count_and_ranks(tmp_path):
    rules = rules_in(tmp_path, ("rank-rule", {"patterns": [r"RANKED FAILED on GPU \d"]}))
    log = "".join(f"[rank{r}]: RANKED FAILED on GPU {r}\n" for r in (3, 0, 1, 2))
    (f,) = explain_text(log + log, rules).findings
    assert (f.count, f.ranks, len(f.evidence)) == (4, [0, 1, 2, 3], 1)


def test_a_literal_deep_in_a_huge_line_is_matched_in_its_window(tmp_path):
    rules = rules_in(tmp_path, ("deep-rule", {"patterns": [r"DEEP FAILED (?P<n>\d+)"]}))
    line = "x" * 100_000 + " DEEP FAILED 42 " + "y" * 100_000
    (f,) = explain_text(line, rules).findings
    assert f.facts["n"] == "42" and len(f.evidence[0].text) <= 400


def test_selftest_reports_wrong_facts_and_a_firing_near_miss(tmp_path):
    rules = rules_in(tmp_path, ("fact-rule", {
        "patterns": [r"FACT FAILED (?P<n>\d+)"], "examples": [{"text": "FACT FAILED 1", "facts": {"n": "2"}}],
        "near_misses": [{"text": "FACT FAILED 3"}]}))
    results = run_selftest(rules, rulebase.case_runners(), sentences=False)
    assert [(r.kind, r.ok) for r in results] == [("example", False), ("near_miss", False)]
    assert "fact 'n' is '1', expected '2'" in results[0].message
    assert results[1].message == "fired on a near miss"


def test_evidence_rules_are_judged_by_the_runner_of_their_kind(tmp_path):
    from mpdoctor.engine.loader import load_dir

    folder = tmp_path / "rules"
    (folder / "env").mkdir(parents=True)
    (folder / "env" / "e.toml").write_text(
        "id = 'env-rule'\nkind = 'env'\ncategory = 'bf16-unsupported'\ntitle = 't'\ncheck = 'c'\n"
        "[[example]]\nsnapshot = 'a.json'\n[[near_miss]]\nsnapshot = 'b.json'\n")
    rules = load_dir(folder)  # no vocabulary: check 'c' is this test's own
    calls = []

    def runner(rule, ex, all_rules):
        calls.append(ex.snapshot)
        return [assemble(rule, {})] if ex.snapshot == "a.json" else []

    results = run_selftest(rules, {"env": runner})
    assert all(r.ok for r in results), results
    assert calls == ["a.json", "b.json"]


# --- big logs: regions give the findings of the whole file -------------------------------

def _training_log(lines: int, seed: int, extra: dict[int, str]) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        if i in extra:
            out.append(extra[i])
        out.append(f"[rank0]: step {i:>7} | loss {rng.random() * 3:.4f} | lr 2.9e-04 | grad_norm {rng.random():.3f}")
    return "\n".join(out) + "\n"


def _facts_of(report):
    return [(f.rule, f.count, f.ranks, [e.line for e in f.evidence], sorted(f.facts.items())) for f in report.findings]


@pytest.mark.parametrize("engine", ["hyperscan", "python"])
def test_regions_match_whole_file_across_chunk_boundaries(tmp_path, monkeypatch, engine):
    if engine == "python":
        monkeypatch.setenv("MPDOCTOR_NO_HYPERSCAN", "1")
    else:
        pytest.importorskip("hyperscan")
    # small chunks so that a medium log crosses many boundaries
    monkeypatch.setattr(read, "WHOLE_LIMIT", 64 * 1024)
    monkeypatch.setattr(log_regions, "CHUNK", 64 * 1024)
    tb = (FORMS / "torchrun-tee-default-prefix.log").read_text().rstrip("\n")
    nan = "[rank0]: {'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.5}"
    text = _training_log(16_000, 3, {900: tb, 7_000: nan, 7_001: nan, 7_002: nan, 15_000: tb})
    path = tmp_path / "medium.log"
    path.write_text(text)
    rules = rulebase.load()
    whole = explain_text(text, rules)
    regions = explain_path(path, rules)
    assert regions.input["scanned"] == "regions" and regions.input["matcher"] == engine
    assert _facts_of(regions) == _facts_of(whole)
    assert [(u.exception, u.line) for u in regions.unrecognised] == [(u.exception, u.line) for u in whole.unrecognised]
    # line numbers point at the pasted lines
    lines = text.split("\n")
    for f in regions.findings:
        for e in f.evidence:
            if not e.text.startswith("user code:"):
                assert e.text[:60] in lines[e.line - 1], (f.rule, e.line)


def test_a_line_longer_than_a_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "WHOLE_LIMIT", 16 * 1024)
    monkeypatch.setattr(log_regions, "CHUNK", 16 * 1024)
    oom = (FORMS / "slurm-srun-label.log").read_text()
    text = "a" * 100_000 + "\n" + "b " * 50_000 + "\n" + oom
    path = tmp_path / "long.log"
    path.write_text(text)
    rules = rulebase.load()
    assert _facts_of(explain_path(path, rules)) == _facts_of(explain_text(text, rules))


def test_40mb_log_same_findings_with_and_without_hyperscan(tmp_path):
    pytest.importorskip("hyperscan")
    tb = (FORMS / "torchrun-tee-default-prefix.log").read_text().rstrip("\n")
    path = tmp_path / "big.log"
    with path.open("w") as fh:
        rng = random.Random(11)
        i = 0
        while fh.tell() < 40_000_000:
            i += 1
            if i == 3000:
                fh.write("[rank0]: {'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.1}\n")
            fh.write(f"[rank0]: step {i:>8} | loss {rng.random() * 3:.4f} | lr 2.9e-04 | "
                     f"grad_norm {rng.random():.3f} | tokens/s {rng.randint(40000, 60000)}\n")
        fh.write(tb + "\n")
    out = {}
    for engine, env in (("hyperscan", {}), ("python", {"MPDOCTOR_NO_HYPERSCAN": "1"})):
        code = ("import resource, subprocess, sys; "
                "p = subprocess.run(sys.argv[1:], capture_output=True); sys.stdout.buffer.write(p.stdout); "
                "sys.stderr.write('MAXRSS_KB=%d' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        proc = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "mpdoctor", "explain", str(path),
                               "--format", "json"], capture_output=True, env={**os.environ, **env}, timeout=600)
        data = json.loads(proc.stdout)
        assert data["input"]["matcher"] == engine and data["input"]["scanned"] == "regions"
        rss_mb = int(proc.stderr.decode().split("MAXRSS_KB=")[1]) / 1024
        assert rss_mb < 200, f"{engine}: peak memory {rss_mb:.0f} MB"
        out[engine] = (data["findings"], data["unrecognised"])
    assert out["hyperscan"] == out["python"]
    rules = [f["rule"] for f in out["hyperscan"][0]]
    assert rules[0] == "cuda-oom"
