"""An exception the training caught and trained on after (an OOM inside accelerate's
find_executable_batch_size, which retries with a smaller batch) is information, not the
run's failure: `mpdoctor run --fail-on error` keeps the command's exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripts" / "oom_retry_smaller_batch.py"
EVENTS = ROOT / "fixtures" / "events"


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    yield
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(True)


def test_run_fail_on_error_keeps_exit_0_after_a_recovered_oom(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--fail-on", "error", "--report", str(report), "--",
                        sys.executable, str(SCRIPT)], capture_output=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert p.stdout.decode().splitlines()[-1] == "trained with batch size 15"  # the command's own output
    data = json.loads(report.read_text())
    assert [f["severity"] for f in data["findings"]] == ["info"]
    f = data["findings"][0]
    assert (f["rule"], f["category"]) == ("oom-recovered", "out-of-memory")
    assert f["facts"]["tries"] == 6 and f["facts"]["first_error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert "(32, 8)" in f["facts"]["batch_shapes"]


def test_an_oom_nothing_trained_after_is_still_the_error() -> None:
    """The look-alike (the rule's near miss): every batch size ran out of memory, the
    decorator gave up; recorded by the same script with `never-fits`."""
    from mpdoctor import rulebase
    from mpdoctor.diagnosis.run import judge_run
    from mpdoctor.run.evidence import read_evidence

    evidence = read_evidence(str(EVENTS / "oom-retried-never-fits.json"))
    assert evidence["exit_code"] == 1 and not evidence["processes"][0]["watch"]["recovered"]
    found = judge_run(evidence, rulebase.load()).findings
    assert found[0].severity == "error" and found[0].category == "out-of-memory"
    assert "oom-recovered" not in [f.rule for f in found]


def test_the_handle_moves_a_caught_oom_to_recovered_after_the_next_optimizer_step() -> None:
    from accelerate.utils import find_executable_batch_size
    from torch import nn

    import mpdoctor

    class Capped(nn.Linear):
        def forward(self, x):
            if x.shape[0] > 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
            return super().forward(x)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), Capped(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    seen_before_step = []

    @find_executable_batch_size(starting_batch_size=5)
    def train(batch_size):
        loss = net(torch.randn(batch_size, 4)).pow(2).mean()
        loss.backward()
        seen_before_step.append(len(h.errors))  # caught, not yet recovered: still an error
        opt.step()
        opt.zero_grad()
        return batch_size

    with mpdoctor.watch(net) as h:
        assert train() == 4
        found = h.findings()
    assert seen_before_step == [1]
    assert not h.errors and [e.module for e in h.recovered] == ["1"]
    assert [f.rule for f in found if f.severity != "info"] == []
    assert "oom-recovered" in [f.rule for f in found]
