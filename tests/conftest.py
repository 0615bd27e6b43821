"""Every test runs isolated from the user's machine: its own rule cache (never the
user's ~/.cache/mpdoctor), no user rules folder (MPDOCTOR_RULES_PATH), no debug or
fault switches. Set at import, before any test module loads the rule base, and for
the subprocesses the tests start, which inherit the environment.

It also records the rule id of every finding made in this process; at the end of the
session each must be a documented rule of the rule base (tests/test_rule_ids.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="mpdoctor-test-cache-")
os.environ["MPDOCTOR_CACHE_DIR"] = _CACHE
for _name in ("MPDOCTOR_RULES_PATH", "MPDOCTOR_NO_CACHE", "MPDOCTOR_DEBUG", "MPDOCTOR_INSTRUMENT_FAIL",
              "MPDOCTOR_PROBE_FAULT", "MPDOCTOR_SAVE_EVENTS", "MPDOCTOR_SAVE_PROBE", "MPDOCTOR_WATCH_EVERY"):
    os.environ.pop(_name, None)
# A check that raises is a failure in every test, never "nothing found" (engine.judge);
# the tests of the user-facing "could not be judged" turn it off for themselves.
os.environ["MPDOCTOR_STRICT_CHECKS"] = "1"
# The user's home is not the tests': most accelerate users have a default config in
# ~/.cache/huggingface/accelerate/, and a test must judge what it sets up, not that.
_HOME = tempfile.mkdtemp(prefix="mpdoctor-test-home-")
os.environ["HOME"] = _HOME
os.environ["XDG_CACHE_HOME"] = os.path.join(_HOME, ".cache")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_HOME, ".config")
for _name in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_DATASETS_CACHE",
              "ACCELERATE_CONFIG_FILE", "TORCH_HOME", "PYTHONUSERBASE"):
    os.environ.pop(_name, None)
os.environ["HF_HOME"] = os.path.join(_HOME, ".cache", "huggingface")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _name in [n for n in os.environ if n.startswith("ACCELERATE_")]:
    os.environ.pop(_name, None)

from mpdoctor import findings as _findings  # noqa: E402  (after the environment is set)
from mpdoctor.engine import assemble as _assemble  # noqa: E402

EMITTED: set[str] = set()       # the rule id of every Finding made in this process
TEST_RULES: set[str] = set()    # ids of rules that tests wrote into their own tmp folders
_post_init = _findings.Finding.__post_init__
_assemble_fn = _assemble.assemble
_BUILTIN = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "rules"))


def _recording_post_init(self: _findings.Finding) -> None:
    _post_init(self)
    EMITTED.add(self.rule)


def _recording_assemble(rule, *args, **kwargs):
    if not os.path.realpath(str(rule.path)).startswith(_BUILTIN):
        TEST_RULES.add(rule.id)
    return _assemble_fn(rule, *args, **kwargs)


_findings.Finding.__post_init__ = _recording_post_init  # type: ignore[method-assign]
_assemble.assemble = _recording_assemble


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: a live test that trains or launches processes (deselect with "
                                       "-m 'not slow' for a fast inner loop)")


# The workers' share of the suite (`--dist loadgroup` in pyproject.toml, scheduled here): a
# test file with a module fixture of its own (a launched job, a Jupyter kernel, a built
# wheel) goes whole to one worker, so the fixture is made once; every other test is handed
# out alone, to whichever worker is free. The live tests go out first, the costliest files
# first, so that no worker is left alone with a long one at the end (--no-loadscope-reorder:
# not xdist's order by the number of tests). xdist's own loadgroup marks cannot do the
# grouping: with pytest 9 its node-id suffix is lost (it sets a field pytest no longer reads).
# `-n0` keeps the files' order (test_rule_ids.py last).
# the files whose live tests cost most, costliest unit first (measured: --durations and
# MPDOCTOR_TEST_CPU_LOG); a file not named here goes after them, in the collected order
LONG_POLES = ("test_gpu_kit.py", "test_probe_live.py", "test_job_live.py", "test_scenarios.py",
              "test_probe_model.py", "test_run_accelerate.py", "test_run_instrumented.py", "test_probe_stable.py",
              "test_run_robust.py", "test_recipe_scaler.py", "test_integrations.py", "test_instrument_recovered.py",
              "test_notebook.py", "test_wheel.py", "test_check_live.py", "test_instrument_steps.py")
_TESTS = os.path.dirname(os.path.abspath(__file__))


_SHARES: dict[str, bool] = {}


def _shares_a_module_fixture(path: str) -> bool:
    """Whether the test file (a node id's path) defines a module-, package- or session-scoped fixture."""
    import re

    name = os.path.basename(path)
    if name not in _SHARES:
        try:
            with open(os.path.join(_TESTS, name), encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            text = ""
        _SHARES[name] = re.search(r"@pytest\.fixture\([^)]*scope=[\"'](module|package|session)[\"']", text) is not None
    return _SHARES[name]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileOrTest(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _shares_a_module_fixture(path) else nodeid

    return ByFileOrTest(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        return  # only on xdist's workers under --dist loadgroup (xdist sets `loadgroup` there)

    def key(item) -> tuple[int, int]:
        live = item.get_closest_marker("slow") is not None or _shares_a_module_fixture(str(item.path))
        name = item.path.name
        return (0, LONG_POLES.index(name) if name in LONG_POLES else len(LONG_POLES)) if live else (1, 0)

    items.sort(key=key)  # stable: within a file, the collected order


# Under pytest-xdist each worker records the ids of its own findings and hands them to the
# controller, which checks the union at the end of the session (tests/test_rule_ids.py
# does the same check in a run without workers).
@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    out = getattr(node, "workeroutput", None) or {}
    EMITTED.update(out.get("mpdoctor_emitted", ()))
    TEST_RULES.update(out.get("mpdoctor_test_rules", ()))


def pytest_sessionfinish(session, exitstatus) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(_HOME, ignore_errors=True)
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker
        config.workeroutput["mpdoctor_emitted"] = sorted(EMITTED)
        config.workeroutput["mpdoctor_test_rules"] = sorted(TEST_RULES)
        return
    if getattr(config.option, "numprocesses", None) and EMITTED:
        from mpdoctor import rulebase

        rules = {r.id: r for r in rulebase.load()}
        unknown = sorted(r for r in EMITTED if r not in rules and r not in TEST_RULES)
        undocumented = sorted(r for r in EMITTED & rules.keys()
                              if not (rules[r].examples and rules[r].near_misses
                                      and (rules[r].doc.get("detects") or rules[r].summary)))
        if unknown or undocumented:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            msg = (f"findings from rules that are not in rules/: {unknown}; "
                   f"rules without examples, near misses or docs: {undocumented}")
            if reporter is not None:
                reporter.write_line(f"FAILED rule-id check: {msg}", red=True)
            session.exitstatus = 1


# The suite's cost in CPU-seconds, which a busy machine does not inflate as it does wall
# time: with MPDOCTOR_TEST_CPU_LOG=FILE each test appends one line to FILE, its node id and
# the CPU-seconds (user + system) of this process and of every process it started and
# waited for (a module fixture's are counted in the test that set it up), and its wall
# seconds, tab-separated. Nothing is written without the variable.
_CPU_LOG = os.environ.get("MPDOCTOR_TEST_CPU_LOG")


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        yield
        return
    import time

    cpu, wall = _cpu_now(), time.monotonic()
    yield
    line = f"{item.nodeid}\t{_cpu_now() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n"
    with open(_CPU_LOG, "a", encoding="utf-8") as fh:
        fh.write(line)
