"""A job on this CPU, live: two torchrun agents (two nodes on 127.0.0.1, c10d rendezvous),
two gloo ranks each, each agent under `mpdoctor run --job-dir`; then `mpdoctor explain`
over the job folder. The scenarios are fixtures/jobs/train_job.py's, recorded by
fixtures/jobs/record.py (the same code path records the fixtures).

Slow: each job imports torch in six processes on a small machine (about a minute here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mpdoctor import cli

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures" / "jobs"))
import record  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["dtype", "raise", "stall", "mixed"])
def job(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"job-{request.param}")
    codes = record.run_job(request.param, str(out), timeout=5.0)
    return request.param, out, codes


def explain_json(path, capsys):
    code = cli.main(["explain", str(path), "--format", "json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


FIRST = {"dtype": 0, "raise": 1, "stall": 2}


def test_each_node_is_run_and_reported_into_the_job_folder(job):
    scenario, out, codes = job
    assert codes == ([0, 0] if scenario == "mixed" else codes) and (scenario == "mixed" or all(codes))
    reports = sorted((out / "job").glob("*.report.json"))
    assert len(reports) == 2
    nodes = [json.loads(p.read_text())["node"] for p in reports]
    assert sorted(r for n in nodes for r in n["ranks"]) == [0, 1, 2, 3]
    assert all(n["env"].get("torch") and n["local_world_size"] == 2 for n in nodes)


def test_explain_over_the_job_folder_names_the_first_rank_and_its_cause(job, capsys):
    scenario, out, _ = job
    code, report = explain_json(out / "job", capsys)
    if scenario == "mixed":
        assert code == 0
        (f,) = [f for f in report["findings"] if f["rule"] == "nodes-differ"]
        assert f["facts"]["what"] == "mixed_precision" and "bfloat16" in f["title"]
        return
    assert code == 1
    titles = " | ".join(f["title"] for f in report["findings"][:3])
    _first_rank_named(report, scenario, titles)
    if scenario == "dtype":
        assert "mismatched collectives" in titles
    elif scenario == "raise":
        assert "ValueError: batch 17 has 3 labels" in titles
    else:  # the straggler: where it was while the others waited
        assert "Rank 2 was at train_job.py:34 in <module> while ranks 0, 1, 3 waited in all_reduce" in titles


def test_explain_over_logs_and_reports_together_agrees(job, capsys):
    scenario, out, _ = job
    if scenario == "mixed":
        return
    _, report = explain_json(out, capsys)
    _first_rank_named(report, scenario, " | ".join(f["title"] for f in report["findings"][:3]))


def _first_rank_named(report, scenario, titles):
    """The job's first rank: a failure's (dtype, raise). A straggler (stall) raised nothing
    itself; whether the others' timeouts also order it first depends on their timing
    under load, so its naming in the hang finding's title is what the user must see."""
    first = report["job"].get("first_failure")
    if scenario == "stall":
        assert (first is None or first["rank"] == FIRST[scenario]) and "Rank 2 " in titles, (first, titles)
    else:
        assert first["rank"] == FIRST[scenario]


def test_every_rank_wrote_its_flight_recorder_record_on_a_distributed_failure(job):
    scenario, out, _ = job
    dumps = sorted(p.name for p in (out / "job" / "flight").iterdir())
    if scenario == "stall":  # every rank got a distributed error (timeout or lost peer)
        assert len(dumps) == 4
    if scenario == "dtype":  # rank 0 aborted in C++ (SIGABRT): no Python ran to dump it
        assert not any(d.endswith("rank_0") for d in dumps)
