"""The recorder's handle on real torch (CPU): its records are current without a flush,
and what it cannot hook it skips, says so, and never raises into the training."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mpdoctor  # noqa: E402


class WithScripted(nn.Module):
    """A model with a TorchScript submodule (a scripted layer inside a Python model)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.scripted(self.embed(x)))


def test_first_nonfinite_is_current_when_the_nan_is_on_the_last_step() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    h = mpdoctor.watch(net)
    for step in range(3):
        if step == 2:
            with torch.no_grad():
                net[1].bias.fill_(float("nan"))
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    # no findings(), flush() or close(): the last step's values are read when asked for
    nf = h.first_nonfinite
    assert nf is not None and (nf.module, nf.phase, nf.step, nf.kind) == ("1", "forward", 2, "nan")
    assert [n.module for n in h.nonfinite] == ["1"]
    h.close()


def test_a_torchscript_submodule_is_skipped_and_the_rest_is_watched() -> None:
    torch.manual_seed(0)
    net = WithScripted()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    h = mpdoctor.watch(net)  # used to raise "register_forward_pre_hook is not supported on ScriptModules"
    assert [(u["module"], u["module_type"]) for u in h.unhooked] == [("scripted", "RecursiveScriptModule")]
    for step in range(2):
        if step == 1:
            with torch.no_grad():
                net.head.weight.fill_(float("inf"))
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert not h.internal_errors and not h.disabled
    nf = h.first_nonfinite
    assert (nf.module, nf.step) == ("head", 1)  # the Python modules around it are watched
    assert h.snapshot()["unhooked"][0]["reason"].startswith("a TorchScript module")
    h.close()
    assert not any(m._forward_hooks for m in net.modules() if not isinstance(m, torch.jit.ScriptModule))


def test_a_scripted_model_watched_whole_trains_untouched() -> None:
    torch.manual_seed(0)
    net = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)))
    with mpdoctor.watch(net) as h:
        out = net(torch.randn(2, 4))
    assert out.shape == (2, 1) and h.unhooked[0]["module_type"] == "RecursiveScriptModule"
    assert not h.internal_errors


def test_under_mpdoctor_run_a_scripted_submodule_fails_open(tmp_path) -> None:
    """The same model in a wrapped run: the command's exit status and output are its own."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\nimport mpdoctor\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = nn.Linear(4, 4); self.s = torch.jit.script(nn.Linear(4, 4))\n"
        "    def forward(self, x):\n"
        "        return self.s(self.a(x))\n"
        "m = M()\nh = mpdoctor.watch(m)\nprint('shape', tuple(m(torch.ones(2, 4)).shape))\n")
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable,
                        str(script)], capture_output=True, timeout=180, cwd=tmp_path)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout == b"shape (2, 4)\n"
    assert b"Traceback" not in p.stderr
