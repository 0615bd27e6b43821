"""Issue 19 item 1: the AMP recipe's steps, judged from the order of the calls a real loop
made (the GradScaler on the CPU), even when nothing raised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mpdoctor  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripts" / "scenarios" / "amp_clip_before_unscale.py"


def loop(h, unscale_first: bool, clip: bool = True, steps: int = 3) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(net(x).float(), y)
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
        scaler.step(opt)
        scaler.update()


def rules_of(findings) -> list[str]:
    return [f.rule for f in findings]


def test_clipping_scaled_gradients_is_named_with_the_scale_and_the_norm_seen() -> None:
    with mpdoctor.watch() as h:
        loop(h, unscale_first=False)
        found = h.findings()
    f = next(f for f in found if f.rule == "scaler-clip-before-unscale")
    assert f.category == "fp16-gradient-unscale" and f.severity == "warning"
    assert f.facts["scale"] == "65,536" and f.facts["max_norm"] == "1" and f.facts["clips_scaled"] == 3
    # the norm clip_grad_norm_ saw is the real one times the scale
    assert abs(float(f.facts["norm_seen"]) / 65536 - float(f.facts["true_norm"])) < 0.01
    assert "scaler.unscale_(optimizer)" in f.fixes[0]


@pytest.mark.parametrize("unscale_first, clip", [(True, True), (False, False)])
def test_the_recipe_followed_or_no_clip_is_not_a_finding(unscale_first, clip) -> None:
    with mpdoctor.watch() as h:
        loop(h, unscale_first=unscale_first, clip=clip)
        found = h.findings()
    assert "scaler-clip-before-unscale" not in rules_of(found)


def test_a_disabled_scaler_clips_plain_gradients() -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with mpdoctor.watch(net) as h:
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(net(torch.randn(4, 4)).pow(2).mean()).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        found = h.findings()
    assert "scaler-clip-before-unscale" not in rules_of(found)


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [False, True])
def test_run_names_the_missing_unscale_as_the_first_finding(tmp_path, fixed) -> None:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable, str(SCRIPT)]
    p = subprocess.run(cmd + (["fixed"] if fixed else []), capture_output=True, timeout=240, cwd=tmp_path,
                       env=dict(os.environ, NO_COLOR="1"))
    assert p.returncode == 0  # nothing raised, the exit status passes through
    assert b"CHECK loss moved by" in p.stdout
    data = json.loads(report.read_text())
    rules = [f["rule"] for f in data["findings"]]
    if fixed:
        assert "scaler-clip-before-unscale" not in rules
        return
    top = data["findings"][0]
    assert (top["rule"], top["facts"]["step"], top["facts"]["scale"]) == ("scaler-clip-before-unscale", 0, "65,536")
    assert b"clipped while still multiplied by the loss scale" in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode, title", [
    ("update", b"scaler.update() was called with no scaler.step() since the last update"),
    ("unscale", b"scaler.unscale_() was called twice on one optimizer before scaler.update()"),
])
def test_a_scaler_call_out_of_order_under_accumulation_is_named(tmp_path, mode, title) -> None:
    script = ROOT / "fixtures" / "scripts" / "scenarios" / "amp_accumulation_scaler_order.py"
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable,
                        str(script), mode], capture_output=True, timeout=240, cwd=tmp_path, env=dict(os.environ, NO_COLOR="1"))
    assert p.returncode == 1  # the script's own exit status
    top = json.loads(report.read_text())["findings"][0]
    assert (top["rule"], top["category"]) == ("scaler-call-order", "fp16-gradient-unscale")
    assert top["facts"]["user_frame"].endswith("amp_accumulation_scaler_order.py:" + ("36" if mode == "update" else "30"))
    assert title in p.stderr
