"""Loading rules: every malformed file gets a message naming the file, the rule and the
problem; user folders override built-ins; the compiled-rules cache is invisible."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.engine import rulecache
from mpdoctor.engine.rule import LazyPattern, RuleError
from mpdoctor.logs import explain_text
from tests.rulekit import private_cache, rule_toml, rules_in, write_rule  # noqa: F401 (private_cache is an autouse fixture)

BAD = [
    # (what the file says, words the message must contain)
    ("id = 'x'\ncategory = [", ["is not valid TOML"]),
    (rule_toml("bad", id=None), ["needs an 'id'"]),
    (rule_toml("Bad_Id"), ["needs an 'id'"]),
    (rule_toml("bad", colour="red"), ["'bad'", "unknown keys: colour"]),
    (rule_toml("bad", category="fp16-problem"), ["'bad'", "category 'fp16-problem' is not in docs/categories.md"]),
    (rule_toml("bad", severity="fatal"), ["'bad'", "severity must be one of error, warning, info"]),
    (rule_toml("bad", title=""), ["'bad'", "needs a 'title'"]),
    (rule_toml("bad", patterns=None), ["'bad'", "a log rule needs 'patterns'"]),
    (rule_toml("bad", patterns=[r"\d+ \w+"]), ["'bad'", "has no literal text of at least 3 characters"]),
    (rule_toml("bad", patterns=[r"(a+)+ FAILED"]), ["'bad'", "nests an unbounded repetition"]),
    (rule_toml("bad", patterns=[r"FAILED (unclosed"]), ["'bad'", "not a valid regular expression"]),
    (rule_toml("bad", unless=[r"x{2,1}"]), ["'bad'", "unless: the pattern"]),
    (rule_toml("bad", examples=[]), ["'bad'", "needs at least one [[example]]"]),
    (rule_toml("bad", near_misses=[]), ["'bad'", "needs at least one [[near_miss]]"]),
    (rule_toml("bad", examples=[{"text": "a", "file": "b.log"}]), ["'bad'", "example[0] of a log rule needs exactly one of text or file"]),
    (rule_toml("bad", examples=[{"text": "a", "fact": {}}]), ["'bad'", "example[0] has unknown keys: fact"]),
    (rule_toml("bad", derive="no_such_deriver"), ["'bad'", "derive 'no_such_deriver' is not one of"]),
    (rule_toml("bad", priority="high"), ["'bad'", "'priority' must be a whole number"]),
    (rule_toml("bad", consequence="yes"), ["'bad'", "'consequence' must be true or false"]),
    (rule_toml("bad", fixes=[1, 2]), ["'bad'", "'fixes' must be a string or a list of strings"]),
    (rule_toml("bad", kind="gpu"), ["'bad'", "kind must be one of log, env"]),
    (rule_toml("bad", kind="env"), ["'bad'", "an env rule needs 'check'"]),
]


@pytest.mark.parametrize("text, words", BAD, ids=[w[-1][:40] for _, w in BAD])
def test_malformed_rule_names_file_rule_and_problem(tmp_path, text, words):
    path = tmp_path / "rules" / "log" / "bad.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(RuleError) as err:
        rulebase.load_folder(tmp_path / "rules")
    message = str(err.value)
    assert message.startswith(str(path))
    for w in words:
        assert w in message


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "r" / "x.toml"
    path.parent.mkdir()
    path.write_bytes(b"id = '\xff\xfe'\n")
    with pytest.raises(RuleError, match="x.toml"):
        rulebase.load_folder(tmp_path / "r")


def test_same_id_twice_in_one_folder(tmp_path):
    write_rule(tmp_path / "r", "twice")
    (tmp_path / "r" / "log" / "other.toml").write_text(rule_toml("twice"))
    with pytest.raises(RuleError, match="the same id is already used by"):
        rulebase.load([tmp_path / "r"])


def test_not_a_folder(tmp_path):
    with pytest.raises(RuleError, match="is not a folder of rules"):
        rulebase.load([tmp_path / "missing"])


def test_user_rule_overrides_builtin_of_the_same_id(tmp_path):
    write_rule(tmp_path / "mine", "cuda-oom", category="out-of-memory", title="my own OOM rule",
               patterns=["CUDA out of memory"], examples=[{"text": "CUDA out of memory"}])
    rules = rulebase.load([tmp_path / "mine"])
    (oom,) = [r for r in rules if r.id == "cuda-oom"]
    assert oom.title == "my own OOM rule"
    assert explain_text("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB", rules).findings[0].title \
        == "my own OOM rule"


def test_rules_path_environment_variable(tmp_path, monkeypatch):
    write_rule(tmp_path / "a", "from-env-a")
    write_rule(tmp_path / "b", "from-env-b")
    monkeypatch.setenv("MPDOCTOR_RULES_PATH", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    ids = {r.id for r in rulebase.load()}
    assert {"from-env-a", "from-env-b", "cuda-oom"} <= ids


def test_patterns_compile_lazily_and_behave_like_re(tmp_path):
    write_rule(tmp_path / "r", "lazy", patterns=[r"LAZY FAILED (?P<code>\d+)"])
    (rule,) = rulebase.load_folder(tmp_path / "r")
    rx = rule.patterns[0]
    assert isinstance(rx, LazyPattern) and rx._rx is None
    assert rx.search("x LAZY FAILED 42").group("code") == "42"
    assert rx.groupindex == {"code": 1} and rx._rx is not None


def test_cache_gives_the_same_rules_and_notices_a_changed_file(tmp_path):
    path = write_rule(tmp_path / "r", "cached", patterns=[r"CACHED FAILED (?P<n>\d+)"])
    first = rulebase.load_folder(tmp_path / "r")
    assert (tmp_path / "cache" / "rules.marshal").is_file()
    rulecache.reset()
    again = rulebase.load_folder(tmp_path / "r")
    assert [(r.id, r.literals, [p.pattern for p in r.patterns], r.title) for r in again] == \
        [(r.id, r.literals, [p.pattern for p in r.patterns], r.title) for r in first]
    # the cached entry is skipped once the file changes (size and mtime differ)
    path.write_text(rule_toml("cached", patterns=[r"CACHED (a+)+ BROKEN"]))
    rulecache.reset()
    with pytest.raises(RuleError, match="nests an unbounded repetition"):
        rulebase.load_folder(tmp_path / "r")


def test_a_corrupt_cache_is_ignored(tmp_path):
    write_rule(tmp_path / "r", "corrupt")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "rules.marshal").write_bytes(b"\x00garbage")
    assert [r.id for r in rulebase.load_folder(tmp_path / "r")] == ["corrupt"]


def test_no_cache_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("MPDOCTOR_NO_CACHE", "1")
    rulecache.reset()
    write_rule(tmp_path / "r", "nocache")
    rulebase.load_folder(tmp_path / "r")
    assert not (tmp_path / "cache").exists()


def test_cache_folder_that_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MPDOCTOR_CACHE_DIR", str(blocker / "cache"))
    rulecache.reset()
    write_rule(tmp_path / "r", "nowrite")
    assert [r.id for r in rulebase.load_folder(tmp_path / "r")] == ["nowrite"]


def test_in_process_reuse_notices_new_rule_files(tmp_path):
    write_rule(tmp_path / "r", "first-rule")
    assert "second-rule" not in {r.id for r in rulebase.load([tmp_path / "r"])}
    write_rule(tmp_path / "r", "second-rule")
    assert "second-rule" in {r.id for r in rulebase.load([tmp_path / "r"])}


def test_builtin_rules_all_load_and_have_literals():
    rules = rulebase.load()
    assert rules, "no built-in rules"
    for r in rules:
        if r.kind == "log":
            assert r.literals and all(len(lit) >= 3 and lit == lit.lower() for lit in r.literals), r.id
            assert isinstance(r.path, Path) and r.path.is_file()


def test_a_rule_read_back_from_the_cache_is_the_rule_in_its_file(tmp_path, monkeypatch):
    """Every attribute a face or `rules test` reads is the same whether the rule was just
    parsed or read back from a warm cache (a key missing from the cached docs once made
    every [unrendered] excuse vanish on the second run)."""
    builtin = Path(rulebase.__file__).resolve().parent.parent / "rules"
    monkeypatch.setenv("MPDOCTOR_NO_CACHE", "1")
    rulecache.reset()
    fresh = {r.id: r for r in rulebase.load_folder(builtin)}
    monkeypatch.delenv("MPDOCTOR_NO_CACHE")
    rulecache.reset()
    rulebase.load_folder(builtin)  # fills the cache
    rulecache.reset()
    cached = {r.id: r for r in rulebase.load_folder(builtin)}
    assert cached.keys() == fresh.keys()
    attrs = ("kind", "category", "severity", "priority", "titles", "summary", "explanation", "fixes",
             "references", "doc", "unrendered", "literals", "check", "supersedes")
    for rid, rule in fresh.items():
        for attr in attrs:
            assert getattr(cached[rid], attr, None) == getattr(rule, attr, None), (rid, attr)
        assert cached[rid].examples == rule.examples, rid
        assert cached[rid].near_misses == rule.near_misses, rid


# -- hostile rule folders and patterns (issue 13) -------------------------------------------

@pytest.mark.parametrize("pattern, words", [
    (r"xyz(a|aa)+b FAILED", "repeats an alternation whose branches can start with the same character"),
    (r"abc\s*\s*\s*\s*\s*\s*\s*\s*x FAILED", "two repetitions side by side"),
    (r"abc(a{1,100}){1,100}b FAILED", "nests counted repetitions"),
    (r"FAILED (?P<p>\S{0,300}?(?P<e>[\w\-]{1,80}?))\.so", "two repetitions side by side"),
])
def test_user_patterns_that_backtrack_are_refused_naming_file_and_rule(tmp_path, pattern, words):
    path = write_rule(tmp_path / "r", "slow", patterns=[pattern])
    with pytest.raises(RuleError) as err:
        rulebase.load_folder(tmp_path / "r")
    assert str(err.value).startswith(str(path)) and "'slow'" in str(err.value) and words in str(err.value)


def test_patterns_the_checker_lets_through_are_fine(tmp_path):
    # alternatives that start differently, a bounded run next to an unbounded one, a small count
    rules = rules_in(tmp_path, ("fine", {"patterns": [r"FINE FAILED (?:nan|inf)+ at \d+\s*[:=]\s{0,4}x",
                                                      r"FINE (?:>=|<=|>|<){0,2} FAILED"]}))
    assert [r.id for r in rules] == ["fine"]


def test_rule_discovery_does_not_follow_a_link_out_of_the_folder(tmp_path):
    import os
    import time

    folder = tmp_path / "r"
    write_rule(folder, "inside")
    os.symlink("/", folder / "root")  # would walk the whole filesystem
    os.symlink(tmp_path / "elsewhere", folder / "away")
    write_rule(tmp_path / "elsewhere", "outside")
    os.symlink(folder / "log", folder / "loop")  # inside, but a loop of the same folder
    t = time.perf_counter()
    rules = rulebase.load_folder(folder)
    assert time.perf_counter() - t < 2
    assert [r.id for r in rules] == ["inside"]


def test_a_fifo_or_a_folder_named_toml_is_skipped_not_read(tmp_path):
    import os
    import subprocess
    import sys

    folder = tmp_path / "r"
    write_rule(folder, "real")
    os.mkfifo(folder / "x.toml")  # opening it would block for ever
    (folder / "y.toml").mkdir()
    code = ("import sys; from mpdoctor import rulebase; "
            "print([r.id for r in rulebase.load_folder(sys.argv[1])])")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['real']"


def test_cache_notices_an_edit_that_keeps_size_and_mtime(tmp_path):
    import os

    from mpdoctor.engine import loader

    path = write_rule(tmp_path / "r", "same", title="Title AAAA")
    st = os.stat(path)
    assert [r.title for r in rulebase.load_folder(tmp_path / "r")] == ["Title AAAA"]
    path.write_text(path.read_text().replace("Title AAAA", "Title BBBB"))  # as `cp -p` leaves it
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    rulecache.reset()
    loader._CACHE.clear()
    assert [r.title for r in rulebase.load_folder(tmp_path / "r")] == ["Title BBBB"]


@pytest.mark.parametrize("entry", [
    "not a tuple", (1, 2), ("digest", 10, "kw", "pats", True, "1:2:3", 0), None,
    "RIGHT_KEY_WRONG_KW",
])
def test_a_cache_entry_of_the_wrong_shape_is_ignored(tmp_path, entry):
    import marshal

    from mpdoctor.engine import loader

    path = write_rule(tmp_path / "r", "shape", patterns=[r"SHAPE FAILED (?P<n>\d+)"])
    rulebase.load_folder(tmp_path / "r")  # writes the cache
    blob_path = tmp_path / "cache" / "rules.marshal"
    blob = marshal.loads(blob_path.read_bytes())
    key = next(iter(blob["entries"]))
    good = blob["entries"][key]
    if entry == "RIGHT_KEY_WRONG_KW":  # the right digest, a constructor argument of another shape
        entry = (*good[:2], {**good[2], "priority": "high", "extra": 1}, *good[3:])
    blob["entries"][key] = entry
    blob_path.write_bytes(marshal.dumps(blob))
    rulecache.reset()
    loader._CACHE.clear()
    rules = rulebase.load_folder(tmp_path / "r")
    assert [r.id for r in rules] == ["shape"] and rules[0].priority == 50
    assert explain_text("SHAPE FAILED 7", rules).findings[0].rule == "shape"
    assert path.is_file()


# -- what a rule names is read from its own folder only (issue 17) ---------------------------

def _run_rules(*args, timeout=60):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mpdoctor", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("name, words", [
    ("/dev/zero", "is an absolute path"),
    ("/etc/passwd", "is an absolute path"),
    ("../../../../etc/passwd", "climbs out with '..'"),
    ("~/.netrc", "is an absolute path"),
])
def test_an_example_file_outside_the_rule_folder_is_a_load_error_not_a_read(tmp_path, name, words):
    """The repro: `file = "/dev/zero"` read until memory ran out, `file = "/etc/passwd"`
    was printed by `rules show`. Each face says which rule file is wrong, reads nothing,
    prints nothing of it; in a few seconds (a read of /dev/zero never ends)."""
    path = write_rule(tmp_path / "r", "mine", examples=[{"file": name}])
    for args in (["rules", "show", "mine", "--rules", tmp_path / "r"], ["rules", "test", tmp_path / "r"],
                 ["rules", "show", "mine", "--rules", tmp_path / "r", "--format", "json"],
                 ["explain", "-", "--rules", tmp_path / "r"]):
        out = _run_rules(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stdout == "" and "root:" not in out.stderr
        assert out.stderr.count("\n") == 1 and str(path) in out.stderr and "'mine'" in out.stderr and words in out.stderr


def test_links_out_devices_fifos_and_big_files_in_the_folder_are_refused(tmp_path):
    import os

    folder = tmp_path / "r"
    (folder / "log").mkdir(parents=True)
    os.symlink("/etc/passwd", folder / "log" / "passwd.log")
    os.symlink("/dev/zero", folder / "log" / "zero.log")
    os.mkfifo(folder / "log" / "fifo.log")
    (folder / "log" / "big.log").write_bytes(b"MINE FAILED\n" * (1 << 17))  # 1.5 MB
    for name, words in (("passwd.log", "is a link out of the rule's folder"),
                        ("zero.log", "is a link out of the rule's folder"),
                        ("fifo.log", "is not a regular file"), ("big.log", "is larger than 1 MB")):
        write_rule(folder, "mine", examples=[{"file": name}])
        rulecache.reset()
        with pytest.raises(RuleError) as err:
            rulebase.load_folder(folder)
        assert "'mine'" in str(err.value) and words in str(err.value), name


def test_a_file_inside_the_folder_still_works_and_a_later_swap_is_refused_on_read(tmp_path):
    """A rule cached while its example was fine, whose example became a link out since:
    the read refuses it (the cache skips the load-time check)."""
    import os

    folder = tmp_path / "r"
    write_rule(folder, "mine", examples=[{"file": "ex.log"}])
    (folder / "log" / "ex.log").write_text("Traceback (most recent call last):\nMINE FAILED here\n")
    out = _run_rules("rules", "test", folder)
    assert out.returncode == 0 and "0 failed" in out.stdout, out.stdout + out.stderr
    out = _run_rules("rules", "show", "mine", "--rules", folder, "--format", "markdown")
    assert out.returncode == 0 and "MINE FAILED here" in out.stdout
    (folder / "log" / "ex.log").unlink()
    os.symlink("/etc/passwd", folder / "log" / "ex.log")
    from mpdoctor.engine.selftest import example_text

    rules = rulebase.load_folder(folder)  # from the cache: the old, checked entry
    with pytest.raises(RuleError, match="is a link out of the rule's folder"):
        example_text(rules[0], rules[0].examples[0])


def test_the_ambiguous_empty_alternation_pattern_is_refused(tmp_path):
    """The repro: this passed the checker and `rules test`, then `explain` ran for minutes
    on a 1 KB log: `(?:_|)` may take nothing, so the letter runs around it are side by side."""
    for pattern in (r"[A-Za-z]+(?:_|)[A-Za-z]+(?:_|)[A-Za-z]+Error: bad thing",
                    r"[A-Za-z]+(?:|_)[A-Za-z]+Error: bad thing", r"\w+(?:-\w+)?\w+Error: bad thing"):
        path = write_rule(tmp_path / "r", "slow", patterns=[pattern])
        rulecache.reset()
        with pytest.raises(RuleError) as err:
            rulebase.load_folder(tmp_path / "r")
        assert str(err.value).startswith(str(path)) and "two repetitions side by side" in str(err.value), pattern
    # a separator that must be there keeps them apart
    write_rule(tmp_path / "r", "slow", patterns=[r"[A-Za-z]+(?:_|-)[A-Za-z]+Error: bad thing"],
               examples=[{"text": "Some_BigError: bad thing"}])
    rulecache.reset()
    assert [r.id for r in rulebase.load_folder(tmp_path / "r")] == ["slow"]


def test_a_user_pattern_the_checker_lets_through_is_stopped_on_a_line_it_runs_away_on(tmp_path):
    """Quadratic on a line of `a_a_a_...` (every start tries every split), and no shape the
    checker refuses: the per-line budget stops it, names the rule once, and explain still
    explains the rest of the log."""
    import subprocess
    import sys

    pattern = r"(?:[a-z]+_)+[a-z]+Error: boom"
    path = write_rule(tmp_path / "r", "slow", patterns=[pattern], examples=[{"text": "some_thingError: boom"}])
    rulebase.load_folder(tmp_path / "r")  # the checker lets it through
    log = tmp_path / "slow.log"
    lines = ["Traceback (most recent call last):", "a_" * 4000 + "-Error: boom",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"] + ["b_" * 4000 + "-Error: boom"] * 50
    log.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "mpdoctor", "explain", str(log), "--rules", str(tmp_path / "r"),
                          "--format", "oneline"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "[cuda-oom]" in out.stdout
    warnings = [line for line in out.stderr.splitlines() if "took more than" in line]
    assert len(warnings) == 1 and "'slow'" in warnings[0] and str(path) in warnings[0]
    # a sound pattern of the same rule file runs as ever
    fine = rules_in(tmp_path / "fine", ("fine", {"patterns": [r"FINE FAILED (?P<n>\d+)"]}))
    assert explain_text("x\nFINE FAILED 7\n", fine).findings[0].facts["n"] == "7"
