"""Issue 19 item 1, the rest of the AMP recipe: several optimizers with one scaler, a
gradient penalty of a scaled loss, the scaler's state in a checkpoint, custom autograd
Functions under autocast, accelerate's accumulation. Each step missing is a finding with
this run's evidence, even when nothing raised, and its look-alike (the recipe followed)
is none. Real loops on the CPU (a CPU GradScaler), in process with `mpdoctor.watch()`,
and the scenario scripts under `mpdoctor run` (slow)."""

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
SCENARIOS = ROOT / "fixtures" / "scripts" / "scenarios"


def rules_of(found) -> list[str]:
    return [f.rule for f in found]


def finding(found, rule: str):
    hits = [f for f in found if f.rule == rule]
    assert hits, f"no {rule} in {rules_of(found)}"
    return hits[0]


# ---- several optimizers, one scaler ----------------------------------------------------
def two_optimizers(mode: str, steps: int = 2) -> list:
    torch.manual_seed(0)
    enc, head = nn.Linear(8, 8), nn.Linear(8, 1)
    opt0, opt1 = torch.optim.SGD(enc.parameters(), lr=0.01), torch.optim.Adam(head.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with mpdoctor.watch() as h:
        for _ in range(steps):
            opt0.zero_grad()
            opt1.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = enc(x)
                loss = nn.functional.mse_loss(head(z).float(), y) + z.float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt0)
            if mode == "update":
                scaler.update()
            if mode == "direct":
                opt1.step()
            elif mode == "unscaled-direct":  # unscaled by hand, then stepped directly: its gradients are right
                scaler.unscale_(opt1)
                opt1.step()
            else:
                scaler.step(opt1)
            scaler.update()
        return h.findings()


def test_an_optimizer_stepped_around_the_scaler_is_named_with_the_scale() -> None:
    f = finding(two_optimizers("direct"), "scaler-optimizer-bypassed")
    assert (f.category, f.severity) == ("fp16-gradient-unscale", "warning")
    assert f.facts["optimizer"] == "#1 Adam" and f.facts["scale"] == "65,536" and f.facts["step"] == 0
    assert f.facts["through_scaler"] == "#0 SGD" and f.facts["steps_bypassing"] == 2
    assert "scaler.step(opt1)" in f.fixes[0]


def test_an_update_between_two_optimizers_steps_is_named_with_both() -> None:
    found = two_optimizers("update")
    f = finding(found, "scaler-update-between-steps")
    assert (f.category, f.facts["before"], f.facts["after"]) == ("loss-scale-overflow", "#0 SGD", "#1 Adam")
    assert f.facts["updates_in_iteration"] == 2 and f.facts["updates"] == 4
    assert "scaler-optimizer-bypassed" not in rules_of(found)


@pytest.mark.parametrize("mode", ["fixed", "unscaled-direct"])
def test_every_optimizer_through_the_scaler_and_one_update_is_no_finding(mode) -> None:
    found = rules_of(two_optimizers(mode))
    assert "scaler-optimizer-bypassed" not in found and "scaler-update-between-steps" not in found


def test_an_optimizer_stepped_without_any_scaler_is_no_finding() -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with mpdoctor.watch() as h:
        for _ in range(2):
            opt.zero_grad()
            net(torch.randn(4, 4)).pow(2).mean().backward()
            opt.step()
        assert "scaler-optimizer-bypassed" not in rules_of(h.findings())


# ---- gradient penalty ------------------------------------------------------------------
def penalty_loop(divide: bool, steps: int = 2) -> list:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with mpdoctor.watch() as h:
        for _ in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(net(x).float(), y)
            grads = torch.autograd.grad(scaler.scale(loss), list(net.parameters()), create_graph=True)
            if divide:
                inv = 1.0 / scaler.get_scale()
                grads = [g * inv for g in grads]
            penalty = sum(g.pow(2).sum() for g in grads)
            scaler.scale(loss + 1e-12 * penalty).backward()
            scaler.step(opt)
            scaler.update()
        return h.findings()


def test_a_penalty_of_scaled_gradients_is_named_with_their_norm() -> None:
    f = finding(penalty_loop(divide=False), "scaler-penalty-not-unscaled")
    assert (f.category, f.severity, f.facts["scale"], f.facts["step"]) == ("fp16-gradient-unscale", "error",
                                                                           "65,536", 0)
    assert f.facts["penalty_factor"] == "4,294,967,296" and f.facts["penalty_unscaled"] == 2
    # the norm autograd.grad returned is the real one times the scale
    assert abs(float(f.facts["grad_norm"].replace(",", "")) / 65536 - float(f.facts["true_norm"])) < 1e-3
    assert "1.0 / scaler.get_scale()" in f.fixes[0]


def test_a_penalty_divided_by_the_scale_is_no_finding() -> None:
    assert "scaler-penalty-not-unscaled" not in rules_of(penalty_loop(divide=True))


# ---- the scaler's state in checkpoints ---------------------------------------------------
def checkpoint_loop(tmp_path: Path, what: str) -> list:
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    with mpdoctor.watch() as h:
        for step in range(2):
            opt.zero_grad()
            scaler.scale(net(torch.randn(4, 4)).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
        if what == "weights":  # weights for inference: no scaler needed
            torch.save(net.state_dict(), tmp_path / "w.pt")
        else:
            ckpt = {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}
            if what == "with-scaler":
                ckpt["scaler"] = scaler.state_dict()
            torch.save(ckpt, tmp_path / "ckpt.pt")
            if what == "scaler-apart":  # accelerate's save_state writes it to its own file
                torch.save(scaler.state_dict(), tmp_path / "scaler.pt")
        return h.findings()


def test_a_checkpoint_without_the_scaler_is_named_with_its_keys_and_the_scale(tmp_path) -> None:
    f = finding(checkpoint_loop(tmp_path, "without"), "scaler-state-not-checkpointed")
    assert (f.category, f.severity) == ("loss-scale-overflow", "warning")
    assert f.facts["keys"] == "'model', 'optimizer', 'epoch'" and f.facts["scale"] == "262,144"
    assert f.facts["where"].startswith(__file__ + ":")
    assert "scaler.state_dict()" in f.fixes[0]


@pytest.mark.parametrize("what", ["with-scaler", "scaler-apart", "weights"])
def test_a_checkpoint_with_the_scaler_or_weights_only_is_no_finding(tmp_path, what) -> None:
    assert "scaler-state-not-checkpointed" not in rules_of(checkpoint_loop(tmp_path, what))


# ---- custom autograd Functions under autocast ------------------------------------------------
class Plain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g.to(x.dtype) @ w.to(x.dtype), g.t().to(x.dtype) @ x


class Decorated(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


def function_loop(fn, autocast: bool) -> list:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 8))
    with mpdoctor.watch() as h:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = fn.apply(torch.randn(3, 8), w)
            out.float().sum().backward()
        return h.findings()


def test_a_custom_function_under_autocast_without_the_decorators_is_named() -> None:
    f = finding(function_loop(Plain, autocast=True), "recipe-custom-function-autocast")
    assert (f.category, f.facts["function"], f.facts["missing"]) == ("dtype-mismatch", "Plain",
                                                                     "custom_fwd and custom_bwd")
    assert (f.facts["autocast_device"], f.facts["autocast_dtype"]) == ("cpu", "bfloat16")
    assert f.facts["forward_at"].startswith(__file__ + ":")
    assert 'custom_bwd(device_type="cpu")' in f.fixes[0]


@pytest.mark.parametrize("fn, autocast", [("Decorated", True), ("Plain", False)])
def test_a_decorated_function_or_one_outside_autocast_is_no_finding(fn, autocast) -> None:
    found = function_loop({"Decorated": Decorated, "Plain": Plain}[fn], autocast)
    assert "recipe-custom-function-autocast" not in rules_of(found)


def test_torchs_own_functions_under_autocast_are_not_the_users() -> None:
    from torch.utils.checkpoint import checkpoint

    lin = nn.Linear(8, 8)
    with mpdoctor.watch() as h:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(lin, torch.randn(2, 8, requires_grad=True), use_reentrant=True)
        out.float().sum().backward()
        assert "recipe-custom-function-autocast" not in rules_of(h.findings())


# ---- the scenario scripts under `mpdoctor run` ----------------------------------------------
def run(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "mpdoctor", "run", "--report", str(report), "--", sys.executable,
                        str(SCENARIOS / script), *args], capture_output=True, timeout=240, cwd=tmp_path,
                       env=dict(os.environ, NO_COLOR="1", HF_HUB_OFFLINE="1"))
    return p, json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("script, mode, rule, status, title", [
    ("amp_two_optimizers_one_scaler.py", "direct", "scaler-optimizer-bypassed", 0,
     b"Optimizer #1 SGD stepped on gradients still multiplied by the loss scale (65,536)"),
    ("amp_two_optimizers_one_scaler.py", "update", "scaler-update-between-steps", 0,
     b"scaler.update() ran between scaler.step() of optimizer #0 SGD and of #1 SGD in one iteration"),
    ("amp_gradient_penalty_unscaled.py", None, "scaler-penalty-not-unscaled", 0,
     b"A gradient penalty was computed from gradients still multiplied by the loss scale (65,536)"),
    ("amp_checkpoint_without_scaler.py", None, "scaler-state-not-checkpointed", 0,
     b"A checkpoint was saved without the loss scaler's state"),
    ("amp_custom_function_no_custom_fwd.py", None, "recipe-custom-function-autocast", 1,
     b"Custom autograd Function LinearFn ran under bfloat16 autocast without custom_fwd and custom_bwd"),
    ("accelerate_accumulation_without_accumulate.py", None, "recipe-accumulate-not-used", 0,
     b"Gradient accumulation of 4 was configured but not used: the optimizer stepped 8 times for 8 backward() calls"),
])
def test_run_names_the_missing_recipe_step_and_not_in_its_look_alike(tmp_path, script, mode, rule, status,
                                                                     title) -> None:
    p, data = run(tmp_path, script, *([mode] if mode else []))
    assert p.returncode == status  # the script's own exit status passes through
    assert b"CHECK " in p.stdout
    rules = [f["rule"] for f in data["findings"]]
    assert rule in rules and title in b" ".join(p.stderr.split())  # the terminal wraps long lines
    if status == 0:  # nothing raised: the recipe's step is what run has to say first
        assert rules[0] == rule
    else:  # the backward's dtype error comes first, the missing decorators right after it
        assert data["findings"][0]["category"] == "dtype-mismatch" and rules.index(rule) <= 2
    fixed_dir = tmp_path / "fixed"
    fixed_dir.mkdir()
    p, data = run(fixed_dir, script, "fixed")
    assert p.returncode == 0 and b"CHECK " in p.stdout
    assert not [f for f in data["findings"] if f["severity"] in ("error", "warning")], data["findings"]
