"""Steps are the user's: optimizer steps (and the micro-batch within an accumulation
cycle), as the loop counts them; evaluation forwards are not steps (real torch, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mpdoctor  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "fixtures" / "scripts" / "scenarios" / "accumulation_eval_nan.py"


class Poisonable(nn.Linear):
    poison = False
    fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("boom in a micro-batch")
        y = super().forward(x)
        return y * float("nan") if self.poison else y


def make_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module("body", nn.Sequential(nn.Linear(8, 16), Poisonable(16, 16), nn.ReLU()))
    net.add_module("head", nn.Linear(16, 1))
    return net


def train(net: nn.Module, steps: int, accumulation: int = 4, eval_batches: int = 3, poison=None, fail=None,
          seen: list | None = None) -> None:
    """`steps` optimizer steps of `accumulation` micro-batches, each step followed by
    `eval_batches` evaluation forwards; `poison`/`fail`: (step, micro) where block 1 turns
    NaN / raises (the raise is caught, as a retry loop would)."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    for step in range(steps):
        net.train()
        for micro in range(accumulation):
            net.body[1].poison = (step, micro) == poison
            net.body[1].fail = (step, micro) == fail
            try:
                loss = net(torch.randn(4, 8)).pow(2).mean() / accumulation
            except RuntimeError:
                continue
            loss.backward()
            if seen is not None:
                seen.append((step, micro))
        net.body[1].poison = net.body[1].fail = False
        opt.step()
        opt.zero_grad()
        net.eval()
        with torch.no_grad():
            for _ in range(eval_batches):
                net(torch.randn(4, 8))


def test_a_nan_is_at_the_loops_optimizer_step_not_the_forward_count() -> None:
    net = make_net()
    with mpdoctor.watch(net) as h:
        train(net, steps=2, poison=(1, 2))
        nf = h.first_nonfinite
        assert (nf.module, nf.phase, nf.step) == ("body.1", "forward", 1)  # not 14 (the 15th forward)
        assert (h.step, h.optimizer_steps) == (1, 2)  # a 2-step run finishes at step 1


def test_the_first_accumulation_cycle_is_step_0() -> None:
    """Before the first optimizer step nothing tells micro-batches from steps: they are
    renumbered when it comes."""
    net = make_net()
    with mpdoctor.watch(net) as h:
        train(net, steps=1, poison=(0, 2), eval_batches=0)
        assert (h.first_nonfinite.module, h.first_nonfinite.step) == ("body.1", 0)
        assert (h.step, h.micro, h.optimizer_steps) == (0, 3, 1)


def test_an_error_names_its_step_and_micro_batch() -> None:
    net = make_net()
    with mpdoctor.watch(net) as h:
        train(net, steps=3, fail=(1, 3))
    assert h.recovered and not h.errors  # caught, and the next optimizer step completed
    err = h.recovered[0]
    assert (err.module, err.step, err.micro) == ("body.1", 1, 3)


def test_evaluation_forwards_begin_no_step() -> None:
    net = make_net()
    with mpdoctor.watch(net) as h:
        train(net, steps=3, accumulation=1, eval_batches=5)
        assert (h.step, h.optimizer_steps) == (2, 3)


def test_a_loop_without_an_optimizer_counts_its_forwards() -> None:
    net = make_net()
    with mpdoctor.watch(net) as h:
        for i in range(3):
            net.body[1].poison = i == 2
            net(torch.randn(4, 8)).sum().backward()
        assert (h.first_nonfinite.step, h.step, h.optimizer_steps) == (2, 2, 0)


def test_mpdoctor_run_reports_the_loops_step(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable,
                        str(SCENARIO)], capture_output=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().splitlines()[-1].startswith("CHECK done: 2 optimizer steps")
    data = json.loads(report.read_text())
    top = next(f for f in data["findings"] if f["category"] == "non-finite-values")
    assert (top["facts"]["module"], top["facts"]["step"]) == ("body.1", 1)
