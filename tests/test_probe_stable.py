"""A probe verdict that can be trusted on a busy machine, and its table at 80 columns.

Pure parts first (the rounds' statistics, rows and report built from recorded round
times: what a user reads when a figure is or is not reliable), then the real thing:
the modes' children timed in turn (the rounds' start times, on the system-wide clock,
alternate) and a core install without torch (exit 2, as the README says).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpdoctor import rulebase
from mpdoctor.diagnosis.probe import ModeJudge
from mpdoctor.probe.recommend import recommend
from mpdoctor.probe.report import ProbeReport, to_markdown, to_text_lines
from mpdoctor.probe.rows import build_rows
from mpdoctor.probe.runner import ChildOutcome, ProbeOptions
from mpdoctor.probe.stability import PRECISE, figure, median_interval, round_ratios, steady
from mpdoctor.render import cells

ROOT = Path(__file__).resolve().parents[1]
LIVE = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("accelerate") is not None


# -- the rounds' statistics -------------------------------------------------------------

def test_median_interval_needs_five_rounds_and_widens_with_fewer_kept():
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None  # no interval at 90% from four values
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0)  # the extremes at n=5
    assert median_interval([float(i) for i in range(1, 11)]) == (2.0, 9.0)  # n=10: the 2nd from each end


def test_a_figure_is_settled_when_its_interval_clears_the_thresholds():
    slow = figure([0.45, 0.47, 0.5, 0.46, 0.52], (1 / 1.1, 1.1))
    assert slow.settled and slow.reliable and slow.value == 0.47
    straddling = figure([0.5, 18.2, 1.9, 0.9, 3.0, 1.2], (1 / 1.1, 1.1))
    assert not straddling.settled and not straddling.precise and not straddling.reliable
    narrow = figure([1.08, 1.1, 1.12, 1.09, 1.11], (1 / 1.1, 1.1))
    assert not narrow.settled and narrow.precise and narrow.reliable  # at the threshold, but known to ±2%
    assert narrow.width <= PRECISE
    assert steady([slow, narrow]) and not steady([slow, straddling])


def test_round_ratios_pair_each_round():
    assert round_ratios([1.0, 2.0, 1.0], [0.5, 1.0, 2.0]) == [2.0, 2.0, 0.5]


# -- what a user reads -----------------------------------------------------------------------

def _result(mode: str, rounds: list[list[float]], dtype: str, *, others: float = 0.0,
            overhead: dict | None = None) -> dict:
    res = {"mode": mode, "ok": True, "device": {"type": "cpu", "name": "test cpu", "native_bf16": [], "threads": 2,
                                                "torch": "2.13.0+cpu"},
           "accelerate": "1.16.0", "native_amp": True, "steps": 5 + 3 * len(rounds), "warmup": 5,
           "step_times_s": [t for r in rounds for t in r], "round_times_s": rounds,
           "step_time_s": sorted(min(r) for r in rounds)[len(rounds) // 2], "final_loss": 5.0,
           "losses": [5.0] * (5 + 3 * len(rounds)), "peak_memory_bytes": 50 << 20, "memory_kind": "rss_peak_growth",
           "autocast_dtype": dtype, "fp8_modules": 0, "cpu_used_by_others": others,
           "observed": {"skipped_steps": 0, "scaler": {"present": False}, "nonfinite": [], "nonfinite_count": 0,
                        "source": "mpdoctor.instrument.watch"},
           "env": {"torch": {"status": "ok", "version": "2.13.0+cpu", "cuda_build": None, "cuda_available": False,
                             "device_count": 0}, "packages": {"versions": {"accelerate": "1.16.0"}}},
           "eval": {"peak_abs": 3.0, "nonfinite_logits": 0, "logits": [1.0, 2.0], "logits_count": 2},
           "workload": {"model": "transformer", "parameters": 470784, "batch_size": 16}}
    if overhead:
        res["overhead"] = overhead
    return res


def _report(base_rounds: list[list[float]], bf16_rounds: list[list[float]], *, others: float = 0.0,
            overhead: dict | None = None) -> ProbeReport:
    opts = ProbeOptions(modes=["no", "bf16"])
    outs = [ChildOutcome(mode="no", result=_result("no", base_rounds, "float32", others=others, overhead=overhead),
                         returncode=0, timed_out=False, wall_s=1.0, stderr_tail="", last_phase="train", last_step=0),
            ChildOutcome(mode="bf16", result=_result("bf16", bf16_rounds, "bfloat16", others=others),
                         returncode=0, timed_out=False, wall_s=1.0, stderr_tail="", last_phase="train", last_step=0)]
    rows = build_rows(outs, opts, ModeJudge(rulebase.load()))
    base = outs[0].result
    return ProbeReport(rows=rows, recommendation=recommend(rows, "cpu"), device=base["device"],
                       workload=base["workload"], overhead=base.get("overhead"),
                       options={"steps": 20, "warmup": 5, "round_steps": 3, "rounds": len(base_rounds),
                                "accelerate": "1.16.0"}, wall_s=42.0)


# bf16 against fp32 round by round: the machine's load swung 30x, the ratio did not
STEADY_BASE = [[0.10, 0.11, 0.12], [3.0, 3.1, 3.2], [0.2, 0.25, 0.21], [1.0, 1.2, 1.1], [0.1, 0.1, 0.1]]
STEADY_BF16 = [[0.20, 0.22, 0.21], [6.3, 6.0, 6.2], [0.41, 0.4, 0.45], [2.1, 2.0, 2.2], [0.21, 0.2, 0.22]]
# the same machine, with bursts landing on one mode's round and not the other's
WILD_BF16 = [[0.05, 0.06, 0.05], [0.17, 0.2, 0.19], [2.0, 2.2, 2.1], [0.3, 0.3, 0.4], [2.0, 2.1, 2.2]]


def test_paired_rounds_give_a_verdict_on_a_busy_machine():
    report = _report(STEADY_BASE, STEADY_BF16, others=0.87)
    bf16 = report.rows[1]
    assert bf16.speedup_reliable is True and 0.45 < bf16.speedup < 0.55
    assert report.recommendation["mode"] == "no" and report.recommendation["basis"] == "none faster"
    text = "\n".join(to_text_lines(report, width=250))
    assert "0.50×" in text and "unreliable" not in text
    assert "Other processes used up to 87% of the CPUs while no, bf16 ran; the modes were timed in turn" in text


def test_an_unreliable_speedup_is_never_printed_as_a_number():
    overhead = {"steps": 6, "watched_median_s": 0.1, "bare_median_s": 0.1, "ratio": 1.4, "low": 0.63, "high": 4.72,
                "reliable": False, "source": "mpdoctor.instrument.watch"}
    report = _report(STEADY_BASE, WILD_BF16, others=0.6, overhead=overhead)
    bf16 = report.rows[1]
    assert bf16.speedup_reliable is False
    rec = report.recommendation
    assert rec["mode"] == "no" and rec["basis"] == "timings unreliable" and rec["timings_reliable"] is False
    text = "\n".join(to_text_lines(report, width=200))
    speed = next(line for line in text.split("\n") if line.startswith("bf16"))
    assert "unreliable (0.05×–17.6×)" in speed, speed  # the interval it fell in, not its median
    assert f"{bf16.speedup:.2f}×" not in text
    assert ("Timings are unreliable: bf16: its speed-up over fp32 ranged 0.05×–17.6× over 5 rounds "
            "(other processes used up to 60% of the CPUs)") in text
    assert "Instrumentation overhead: unreliable (0.63×–4.72× step time;" in text
    assert "1.40×" not in text
    md = to_markdown(report)
    assert "| bf16 | ✓ |" in md and "unreliable (0.05×–17.6×)" in md


def test_too_few_rounds_are_said_as_such():
    report = _report(STEADY_BASE[:2], STEADY_BF16[:2])
    text = to_text_lines(report, width=250)
    speed = next(x for x in text if x.split()[:1] == ["bf16"])
    assert "unreliable (0.5×–0.5× over 2 rounds)" in speed, speed
    assert "only 2 timed rounds, too few to judge" in "\n".join(text)


# -- the table at 80 columns --------------------------------------------------------------

def _assert_laid_out(lines: list[str], width: int = 80) -> None:
    for line in lines:
        assert line == line.rstrip(), f"trailing space: {line!r}"
        if cells(line) > width:
            assert len(line.strip().split()) == 1 or "`" in line, f"over {width} columns: {line!r}"


def test_the_table_at_80_columns_fits_or_turns_and_never_cuts_code():
    report = _report(STEADY_BASE, WILD_BF16, others=0.6)
    lines = to_text_lines(report, width=80)
    _assert_laid_out(lines)
    assert lines[0].split() == ["no", "bf16"]  # twelve columns cannot fit 80: one column per mode
    assert '  code: `Accelerator(mixed_precision="no")`' in lines
    assert "  accelerate config: `mixed_precision: no`" in lines
    wide = to_text_lines(report, width=250)
    assert wide[0].split()[:3] == ["mode", "works", "step"]  # a plain table where it fits
    _assert_laid_out(wide, 250)


def test_markdown_is_a_real_table_and_no_line_is_a_code_block():
    md = to_markdown(_report(STEADY_BASE, STEADY_BF16))
    assert "| mode | works | step time | speed-up |" in md and "|---|---|" in md
    assert not [x for x in md.split("\n") if x.startswith("    ")]
    assert '`Accelerator(mixed_precision="no")`' in md


# -- for real -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not LIVE, reason="torch and accelerate are needed for live probe runs")
def test_the_modes_are_timed_in_turn(tmp_path, monkeypatch):
    """fp32 and bf16 children alive together, timed one after the other, round by round
    (their rounds' start times on the system-wide clock alternate, the first of each
    round turning); three rounds are too few for an interval, and the report says so."""
    from mpdoctor.diagnosis.probe import run_probe
    from mpdoctor.probe.report import to_text_lines

    monkeypatch.setenv("MPDOCTOR_SAVE_PROBE", str(tmp_path))
    opts = ProbeOptions(modes=["no", "bf16"], model="mlp", steps=4, warmup=1, max_steps=4, round_steps=1,
                        batch_size=8)
    report = run_probe(opts)
    data = report.to_dict()
    assert data["options"]["rounds"] == 3
    no, bf16 = data["modes"]
    assert no["ok"] and bf16["ok"] and no["rounds"] == bf16["rounds"] == 3
    starts = []
    for mode in ("no", "bf16"):
        result = json.loads((tmp_path / f"probe-{mode}.json").read_text())["result"]
        assert [len(r) for r in result["round_times_s"]] == [1, 1, 1] and len(result["step_times_s"]) == 4
        starts += [(t, mode) for t in result["round_started_s"]]
    order = [m for _, m in sorted(starts)]
    assert order == ["no", "bf16", "bf16", "no", "no", "bf16"], order
    assert bf16["speedup_reliable"] is False and data["recommendation"]["timings_reliable"] is False
    lines = to_text_lines(report, width=80)
    speed = next(x for x in lines if x.startswith("speed-up"))
    assert speed.split()[-4:-1] == ["over", "3", "rounds)"] or speed.endswith("over 3 rounds)"), speed
    assert "bf16: only 3 timed rounds, too few to judge" in " ".join(x.strip() for x in lines)
    # the overhead pairs ran alone, after the rounds, in the fp32 child
    assert data["overhead"]["steps"] >= 1 and data["overhead"]["reliable"] in (True, False)


# -- a core install beside the training environment ----------------------------------------

CORE = ("rich", "pygments", "markdown_it", "mdurl", "psutil", "pynvml", "packaging", "yaml", "hyperscan")


def test_probe_without_torch_exits_2(tmp_path):
    """mpdoctor installed as pipx does (its own venv: its core dependencies, no torch):
    the probe cannot train anything, says why and how to point it at the training
    environment, and exits 2 (the README)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in CORE:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        target = origin.parent if origin.name == "__init__.py" else origin
        (deps / target.name).symlink_to(target)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mpdoctor").symlink_to(ROOT / "mpdoctor")
    (site / "core-deps.pth").write_text(f"{deps}\n{pkg}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(py), "-m", "mpdoctor", "probe"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith("mpdoctor: ") and "torch" in r.stderr and "Traceback" not in r.stderr
    assert "not installed in mpdoctor's own environment" in r.stderr and "mpdoctor probe --python" in r.stderr
