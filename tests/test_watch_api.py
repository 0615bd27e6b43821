"""`mpdoctor.watch(model_or_accelerator)`: the instrumentation as a Python API, in process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mpdoctor  # noqa: E402
from mpdoctor.instrument import hooks as hooks_mod  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.proj(x))


def make_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module("blocks", nn.Sequential(Block(), Block(), Block()))
    net.add_module("head", nn.Linear(8, 1))
    return net


def categories(findings) -> list[str]:
    return [f.category for f in findings]


def test_fp16_overflow_localised_with_plain_torch() -> None:
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    x = torch.randn(4, 8)
    with mpdoctor.watch(net) as h:
        for step in range(3):
            if step == 2:
                with torch.no_grad():
                    net.blocks[1].proj.bias.fill_(1e5)  # does not fit in fp16
            with torch.autocast("cpu", dtype=torch.float16):
                loss = net(x).float().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        found = h.findings()
    assert h.autocast_dtype == "float16" and h.step == 2
    nf = h.first_nonfinite
    assert (nf.module, nf.phase, nf.step, nf.dtype, nf.kind) == ("blocks.1.proj", "forward", 2, "float16", "inf")
    assert found[0].category == "non-finite-values" and found[0].facts["module"] == "blocks.1.proj"
    assert h.plan.params == {"trainable": {"float32": 3 * 72 + 9}, "frozen": {}}


def test_accelerator_plan_as_it_ran() -> None:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    try:
        acc = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
        h = mpdoctor.watch(acc)  # before prepare: the prepared model is watched
        net = make_net()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        net, opt = acc.prepare(net, opt)
        for _ in range(2):
            loss = net(torch.randn(4, 8)).float().pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        h.flush()
        plan = h.plan
        assert (plan.requested, plan.autocast_dtype, plan.autocast_enabled) == ("bf16", "bfloat16", True)
        assert plan.prepared == {"model": True, "optimizer": True}
        assert (plan.distributed_type, plan.num_processes, plan.fp32_master_weights) == ("NO", 1, True)
        assert plan.autocast_module == "blocks.0.proj"
        # (an env rule may warn about this machine's CPU: bf16 emulated without AVX512-BF16/AMX)
        assert not [f for f in h.findings() if f.severity != "info" and f.rule != "bf16-cpu-not-native"]
        h.close()
    finally:
        AcceleratorState._reset_state(True)


def test_loss_scale_collapse_timeline() -> None:
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with mpdoctor.watch(net) as h:
        for step in range(14):
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(torch.randn(4, 8))
            loss = out.float().mean() * (1e38 if step >= 2 else 1.0)  # the gradients overflow at any scale
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        found = h.findings()
    assert h.skipped_steps == list(range(2, 14))
    assert h.final_scale == 1024.0 / 2 ** 12
    assert h.scaler.scales[0] == (0, 1024.0)
    scale = [f for f in found if f.category == "loss-scale-overflow"][0]
    assert scale.severity == "error" and scale.facts["longest_skip_run"] == 12
    # skipped steps with a scaler are the scaler's business, not a non-finite error in backward
    assert not [f for f in found if f.rule == "nonfinite-made-in-backward"]


def test_fp16_parameters_with_a_grad_scaler_warned_before_it_raises() -> None:
    net = make_net().half()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with mpdoctor.watch(net) as h:
        loss = net(torch.randn(4, 8).half()).float().mean()
        scaler.scale(loss).backward()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.step(opt)
        found = h.findings()
    trap = [f for f in found if f.category == "fp16-gradient-unscale"][0]
    assert trap.severity == "warning" and trap.facts["float16_params"] == f"{3 * 72 + 9:,}"


def test_pure_bf16_updates_that_round_away() -> None:
    net = make_net().to(torch.bfloat16)
    opt = torch.optim.SGD(net.parameters(), lr=1e-5)
    with mpdoctor.watch(net) as h:
        for _ in range(2):
            net(torch.randn(4, 8, dtype=torch.bfloat16)).float().mean().backward()
            opt.step()
            opt.zero_grad()
        found = h.findings()
    assert h.plan.fp32_master_weights is False
    assert h.plan.unchanged_fraction is not None and h.plan.unchanged_fraction > 0.9
    assert "low-precision-updates-lost" in [f.rule for f in found]
    # the same with fp32 weights and lr big enough moves them: no finding
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=1e-1)
    with mpdoctor.watch(net) as h:
        net(torch.randn(4, 8)).mean().backward()
        opt.step()
        assert "low-precision-updates-lost" not in [f.rule for f in h.findings()]


def test_loss_zero_while_gradient_nan() -> None:
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with mpdoctor.watch(net) as h:
        y = -net(torch.randn(4, 8)).abs() - 1.0            # all negative
        loss = torch.where(y > 0, y.sqrt(), 0.0).sum()     # prints 0.0; sqrt's backward is NaN
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        found = h.findings()
    assert loss.item() == 0.0 and norm.isnan()
    trap = [f for f in found if f.rule == "loss-zero-grad-nonfinite"][0]
    assert trap.facts["step"] == 0
    bwd = [f for f in found if f.rule == "nonfinite-in-loss"][0]
    assert bwd.facts["module"] == "(loss)" and bwd.facts["phase"] == "backward"


def test_forward_error_context_names_the_module() -> None:
    net = make_net()
    net.head.half()
    with mpdoctor.watch(net) as h:
        with pytest.raises(RuntimeError):
            net(torch.randn(4, 8))
        found = h.findings()
    err = h.errors[0]  # recorded as raised: the rule base, not the child, says what it is
    assert (err.module, err.context["params"]) == ("head", {"float16@cpu": 2})
    assert err.exception.startswith("RuntimeError: mat1 and mat2 must have the same dtype")
    assert err.context["inputs"] == [{"dtype": "float32", "device": "cpu", "shape": [4, 8]}]
    assert found[0].category == "dtype-mismatch" and found[0].facts["module"] == "head"


def test_fails_open_and_leaves_training_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    def train(watched: bool) -> list[float]:
        net = make_net()
        opt = torch.optim.SGD(net.parameters(), lr=1e-1)
        h = mpdoctor.watch(net) if watched else None
        losses = []
        torch.manual_seed(1)
        for _ in range(3):
            loss = net(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        if h is not None:
            found = h.findings()
            h.close()
            assert h.disabled and [f.rule for f in found] == ["instrumentation-stopped"]
            assert found[0].severity == "info"
        return losses

    bare = train(False)
    monkeypatch.setattr(hooks_mod, "_FORCE_FAIL", True)
    assert train(True) == bare


def test_close_removes_every_hook() -> None:
    net = make_net()
    h = mpdoctor.watch(net)
    assert all(m._forward_hooks for m in net.modules())
    h.close()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net.modules())
    g = mpdoctor.watch()
    from torch.nn.modules import module as nn_module

    assert nn_module._global_forward_hooks
    g.close()
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


def test_watch_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="torch.nn.Module or an accelerate Accelerator"):
        mpdoctor.watch("model")


def test_requested_precision_that_never_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    # `accelerate launch --mixed_precision bf16 train.py` over a plain torch loop: nothing autocasts
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    net = make_net()
    with mpdoctor.watch(net) as h:
        net(torch.randn(4, 8)).mean().backward()
        found = h.findings()
    assert (h.plan.requested, h.autocast_dtype, h.plan.autocast_enabled) == ("bf16", "float32", False)
    f = [f for f in found if f.rule == "precision-not-applied"][0]
    assert f.severity == "warning" and f.facts["module"] == "blocks.0.proj"


def test_an_oom_retry_gets_its_memory_back() -> None:
    import gc
    import weakref

    class Big(nn.Module):
        def forward(self, x):
            self.kept = weakref.ref(x)
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 bytes")

    net = nn.Sequential(nn.Linear(8, 8), Big())
    with mpdoctor.watch(net) as h:
        try:
            net(torch.randn(4, 8))
        except RuntimeError:
            pass
        gc.collect()
        assert net[1].kept() is None  # nothing of ours holds the failed step's tensors
        assert h.errors[0].module == "1" and "can't allocate memory" in h.errors[0].exception
        assert h.errors[0].context["memory"]["host"]  # the memory at that moment


def test_hooks_stay_out_of_a_jit_trace() -> None:
    import warnings

    net = make_net()
    with mpdoctor.watch(net) as h:
        net(torch.randn(4, 8))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.jit.trace(net, torch.randn(4, 8))
            torch.jit.trace(net, torch.randn(4, 8))
        # our reductions read back inside a trace would warn (and enter the user's graph)
        assert not [w for w in caught if w.category.__name__ == "TracerWarning"]
        assert not h.internal_errors
