"""`mpdoctor explain` over a job: several files, a folder or a glob read as one.

The folders under fixtures/jobs/ were recorded live (fixtures/jobs/record.py: two torchrun
agents as two nodes, two gloo ranks each, on this CPU); the NCCL forms are made from torch's
own dump format. Each test asserts what a user reads: the first rank, its cause, what the
others saw, and the exit status.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import cli

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "fixtures" / "jobs"


def explain(*args, capsys):
    code = cli.main(["explain", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def explain_json(*paths, capsys):
    code, out, err = explain(*paths, "--format", "json", capsys=capsys)
    return code, json.loads(out), err


@pytest.mark.parametrize("folder, rank, rule, words", [
    ("dtype-mismatch", 0, "gloo-collective-mismatch", "mismatched collectives"),
    ("rank-raises", 1, None, "ValueError: batch 17 has 3 labels"),
    ("rank-stalls", 2, None, "was late: the others timed out waiting for it"),
])
def test_the_first_rank_that_failed_comes_first_with_its_cause(folder, rank, rule, words, capsys):
    code, report, _ = explain_json(JOBS / folder, capsys=capsys)
    assert code == 1
    first = report["findings"][0]
    assert first["rule"] == "job-first-failure"
    assert first["facts"]["first_rank"] == rank
    assert words in first["title"]
    assert report["job"]["first_failure"]["rank"] == rank
    assert report["job"]["ranks"] == 4 and report["job"]["nodes"] == ["node0", "node1"]
    if rule:  # the cause's own finding follows, on that rank
        assert report["findings"][1]["rule"] == rule and report["findings"][1]["ranks"] == [rank]


def test_what_the_others_saw_is_folded_under_the_first_failure_with_counts_and_ranks(capsys):
    code, out, _ = explain(JOBS / "dtype-mismatch", capsys=capsys)
    assert code == 1
    head = out.split("\n\n")[0]
    assert "Rank 0 (node node0) failed first: gloo received 32 bytes where this rank expected 16" in " ".join(
        head.split())
    said = " ".join(head.split())
    assert "What the others saw: 3 rank(s) (1-3) lost their connection to it" in said
    # torchrun's own summary and stop notices are folded into it, not listed as findings
    assert "launcher-stopping-ranks" not in out and "torchrun-child-failed" not in out


def test_a_straggler_is_found_from_who_did_not_time_out(capsys):
    _, report, _ = explain_json(JOBS / "rank-stalls", capsys=capsys)
    first = report["findings"][0]
    assert first["facts"]["how"] == "the others timed out waiting while it did not: it was late"
    assert "3 rank(s) (0, 1, 3) timed out waiting for it" in first["explanation"]


def test_nodes_with_different_mixed_precision_are_a_finding(capsys):
    code, report, _ = explain_json(JOBS / "mixed-precision-nodes", capsys=capsys)
    assert code == 0  # a warning: the job ran
    (f,) = [f for f in report["findings"] if f["rule"] == "nodes-differ"]
    assert f["facts"]["what"] == "mixed_precision"
    assert "bfloat16 on node1" in f["title"] and "no on node0" in f["title"]


def test_a_glob_of_torchrun_rank_logs_takes_ranks_from_the_layout(capsys):
    pattern = str(JOBS / "rank-raises" / "*" / "job1_*" / "attempt_0" / "*" / "stderr.log")
    code, report, _ = explain_json(pattern, capsys=capsys)
    assert code == 1
    assert report["job"]["first_failure"]["rank"] == 1
    assert report["job"]["ranks"] == 4


def test_per_task_files_take_their_rank_from_the_name(tmp_path, capsys):
    # SLURM's %t: job.<task>.out, here numbered against the recorded ranks
    logs = sorted((JOBS / "rank-stalls").glob("*/job1_*/attempt_0/*/stderr.log"))
    texts = {}
    for p in logs:
        text = p.read_text()
        rank = next((int(line[5]) for line in text.splitlines() if line.startswith("[rank")), None)
        texts[rank] = "\n".join(line.split("]: ", 1)[-1] for line in text.splitlines())  # prefixes gone
    for rank, text in texts.items():
        if rank is not None:
            (tmp_path / f"job.4242.{rank}.out").write_text(text)
    # the straggler printed nothing: an empty file of its own
    (tmp_path / "job.4242.2.out").write_text("")
    files = sorted(tmp_path.iterdir())
    code, report, _ = explain_json(*files, capsys=capsys)
    assert report["job"]["first_failure"]["rank"] == 2
    assert report["findings"][0]["facts"]["how"].endswith("it was late")


def test_one_merged_log_in_a_folder_is_split_by_its_rank_prefixes(tmp_path, capsys):
    # every rank's lines in one file, as `torchrun --tee 3` prints them
    merged = "".join((JOBS / "rank-raises" / n / "launcher.log").read_text() for n in ("node0", "node1"))
    (tmp_path / "train.log").write_text(merged)
    code, report, _ = explain_json(tmp_path, capsys=capsys)
    assert code == 1
    assert report["job"]["first_failure"]["rank"] == 1
    assert "ValueError" in report["findings"][0]["title"]


def test_a_recorded_jobs_evidence_agrees_with_its_folder(capsys):
    from mpdoctor.job.judge import job_case
    from mpdoctor.rulebase import load

    rules = load()
    for name in ("dtype-mismatch", "rank-raises", "rank-stalls"):
        recorded = job_case(str(JOBS / f"{name}.job.json"), rules)
        _, report, _ = explain_json(JOBS / name, capsys=capsys)
        assert recorded[0].rule == report["findings"][0]["rule"]
        assert recorded[0].facts["first_rank"] == report["findings"][0]["facts"]["first_rank"]


# --- Flight Recorder dumps -----------------------------------------------------------------

def test_nccl_flight_recorder_dumps_name_the_mismatched_collective(capsys):
    code, report, _ = explain_json(JOBS / "nccl-dtype-flight", capsys=capsys)
    assert code == 1
    f = report["findings"][0]
    assert f["rule"] == "collective-mismatch"
    assert f["facts"]["seq"] == 1 and f["facts"]["op"] == "all_reduce"
    assert {f["facts"]["dtypes_a"], f["facts"]["dtypes_b"]} == {"float16", "float32"}
    assert "Where each rank called it: rank 0: dump_gloo.py:5; rank 1: dump_gloo.py:5" in f["explanation"] \
        or "fr.py:5" in f["explanation"]


def test_a_rank_missing_from_a_collective_is_named(capsys):
    _, report, _ = explain_json(JOBS / "nccl-missing-rank-flight", capsys=capsys)
    f = report["findings"][0]
    assert f["rule"] == "collective-incomplete"
    assert f["facts"]["missing"] == "1" and f["facts"]["seq"] == 2
    assert "rank 1 at all_reduce #1" in f["explanation"]


def test_recorded_gloo_dumps_pickle_and_json_read_clean(capsys):
    code, report, _ = explain_json(JOBS / "flight-src", capsys=capsys)
    assert code == 0 and report["job"]["collectives"] == 12  # 3 collectives x 2 ranks x 2 formats
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_a_pickle_naming_a_class_is_refused_not_run(tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "ran"),))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Boom()]}, protocol=2))
    (tmp_path / "nccl_trace_rank_1").write_bytes((JOBS / "flight-src" / "gloo_trace_rank_1").read_bytes())
    code, out, err = explain(tmp_path, capsys=capsys)
    assert code == 2
    assert "not a plain Flight Recorder dump, not read" in err and "Traceback" not in err
    assert not (tmp_path / "ran").exists()


# --- hangs ---------------------------------------------------------------------------------

def test_stacks_say_which_rank_is_where_while_the_others_wait(capsys):
    code, report, _ = explain_json(JOBS / "hang-stacks", capsys=capsys)
    f = report["findings"][0]
    assert f["rule"] == "hang-rank-elsewhere"
    assert f["title"] == "Rank 2 was at data.py:88 in load_shard while ranks 0, 1, 3 waited in all_reduce"


def test_stacks_written_by_the_hang_module_parse_to_the_first_dump():
    from mpdoctor.job.stacks import parse_stack

    text = ("# mpdoctor: rank 2 main thread 0x00007f0000000001 (a peer asked)\n"
            "Current thread 0x00007f0000000002 (most recent call first):\n"
            '  File "/x/mpdoctor/instrument/hang.py", line 80 in _watch\n'
            "Thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/home/u/train.py", line 34 in <module>\n'
            "# mpdoctor: rank 2 main thread 0x00007f0000000001 (uncaught RuntimeError)\n"
            "Current thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
            '  File "/home/u/train.py", line 35 in <module>\n')
    assert parse_stack(text) == {"where": "train.py:34 in <module>", "frames": 1, "why": "a peer asked"}


# --- bad input -----------------------------------------------------------------------------

def test_a_missing_path_among_several_is_one_clear_line(tmp_path, capsys):
    code, out, err = explain(JOBS / "rank-raises", tmp_path / "nope", capsys=capsys)
    assert code == 2 and "nope: no such file or folder" in err and "Traceback" not in err


def test_a_glob_that_matches_nothing_says_so(tmp_path, capsys):
    code, _, err = explain(str(tmp_path / "*.log"), capsys=capsys)
    assert code == 2 and "matches no file" in err


def test_standard_input_cannot_join_a_job(capsys):
    code, _, err = explain("-", JOBS / "rank-raises", capsys=capsys)
    assert code == 2 and "standard input" in err


def test_the_job_path_is_not_loaded_for_one_file():
    # one file stays the small script it was: no mpdoctor.job import
    code = ("import sys; from mpdoctor import cli; cli.main(['explain', sys.argv[1], '--format', 'oneline']); "
            "print('mpdoctor.job' in sys.modules)")
    log = JOBS / "dtype-mismatch" / "node0" / "launcher.log"
    proc = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120,
                          cwd=str(ROOT))
    assert proc.stdout.strip().endswith("False")


def test_an_empty_folder_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = explain(tmp_path / "empty", capsys=capsys)
    assert code == 2 and "no file" in err


def test_the_job_reads_from_any_checkout_folder(tmp_path, capsys):
    copy = tmp_path / "some checkout" / "rank-raises"
    shutil.copytree(JOBS / "rank-raises", copy)
    code, report, _ = explain_json(copy, capsys=capsys)
    assert code == 1 and report["job"]["first_failure"]["rank"] == 1


# --- NCCL forms and timestamps -------------------------------------------------------------

def test_nccl_watchdog_timeouts_are_fallout_of_the_rank_that_ran_out_of_memory(capsys):
    # SLURM-style per-task files (train.%t.log), torch 2.x NCCL watchdog wording
    code, report, _ = explain_json(JOBS / "nccl-oom-watchdog", capsys=capsys)
    assert code == 1
    first, cause = report["findings"][:2]
    assert first["title"] == "Rank 1 failed first: The GPU ran out of memory (asked for 4.00 GiB)"
    assert "3 rank(s) (0, 2, 3) timed out waiting for it" in first["explanation"]
    assert cause["rule"] == "cuda-oom" and cause["ranks"] == [1]


def test_two_ranks_failing_on_their_own_are_ordered_by_their_timestamps(capsys):
    _, report, _ = explain_json(JOBS / "two-ooms-timestamps", capsys=capsys)
    assert report["job"]["first_failure"] == {"rank": 2, "how": "timestamps",
                                              "cause": "The GPU ran out of memory (asked for 4.00 GiB)"}
    assert "by the time of each rank's first error" in report["findings"][0]["explanation"]


def test_a_nodes_ranks_come_from_its_launchers_processes_per_node():
    from mpdoctor.job.nodes import _nproc_per_node, node_block

    assert _nproc_per_node(["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"]) == 2
    assert _nproc_per_node(["accelerate", "launch", "--num_processes=16", "--num_machines", "2", "t.py"]) == 8
    evidence = {"command": ["torchrun", "--nproc_per_node=4", "t.py"],
                "processes": [{"rank": 6, "env": {"torch": {"version": "2.13.0"}}}]}
    block = node_block(evidence, {"autocast_enabled": True, "autocast_dtype": "bfloat16"})
    assert block["ranks"] == [4, 5, 6, 7] and block["local_world_size"] == 4
    assert block["env"] == {"torch": "2.13.0", "mixed_precision": "bfloat16"}


def test_rules_list_takes_the_job_kind(capsys):
    """`mpdoctor rules list --kind job` lists the job rules (argparse refused the kind)."""
    assert cli.main(["rules", "list", "--kind", "job", "--format", "oneline"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.split()[1] == "job" for line in lines)
    assert any(line.startswith("collective-mismatch ") for line in lines)
