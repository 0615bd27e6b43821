"""The instrumentation on a GPU: no host synchronisation inside a step (one read per
step), and step sampling (`watch(every=N)`, `MPDOCTOR_WATCH_EVERY`) that bounds its cost.

On a GPU every host read of a device value (`.item()`, `.tolist()`, `.cpu()`, `bool(t)`,
`float(t)`, `torch.cuda.synchronize()`) waits for the queue to drain. Here, on the CPU,
the same Python-level reads are counted: a watched step may add at most one to what the
bare step already does.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mpdoctor  # noqa: E402

_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.by_name: dict[str, int] = {}


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts every host read of a tensor's value made from Python."""
    from mpdoctor.instrument import patches

    monkeypatch.setattr(patches, "_WATCHERS", [])  # only the watchers of this test count
    counter = Counter()

    def counting(name: str, original):
        def wrapper(*args, **kwargs):
            counter.n += 1
            counter.by_name[name] = counter.by_name.get(name, 0) + 1
            return original(*args, **kwargs)
        return wrapper

    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("synchronize", torch.cuda.synchronize))
    return counter


class Poisonable(nn.Linear):
    """A Linear whose output turns NaN on the steps a test chooses."""

    poison = False

    def forward(self, x):
        y = super().forward(x)
        return y * float("nan") if self.poison else y


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = Poisonable(d, d)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


def make_net(depth: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(depth)], nn.Linear(16, 1))


def train_steps(net: nn.Module, steps: int, counter: Counter | None = None, scaler=None,
                poison: set[int] | None = None) -> list[int]:
    """Runs `steps` steps (fp16 autocast, SGD, a GradScaler if given); returns the host
    reads of each. `poison`: the steps on which block 1's Linear outputs NaN (a GradScaler
    then skips the step, so the weights stay finite)."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    per_step = []
    for step in range(steps):
        before = counter.n if counter else 0
        xb = x.clone()
        net[1].fc.poison = bool(poison and step in poison)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = net(xb).float().pow(2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        per_step.append((counter.n - before) if counter else 0)
    return per_step


def test_a_watched_step_adds_at_most_one_host_read(host_reads: Counter) -> None:
    bare = train_steps(make_net(), 8, host_reads, scaler=torch.amp.GradScaler("cpu"))
    net = make_net()
    with mpdoctor.watch(net) as h:
        watched = train_steps(net, 8, host_reads, scaler=torch.amp.GradScaler("cpu"))
        assert not h.internal_errors
    assert h.scaler.updates == 8  # the scaler was watched on every step
    extra = [w - b for w, b in zip(watched, bare)]
    # step 0 reads nothing (its values are read when step 1 begins); then one read a step
    assert extra[0] == 0 and all(e <= 1 for e in extra), (extra, host_reads.by_name)
    assert sum(extra) == 7


def test_a_hook_that_reads_a_value_is_seen(host_reads: Counter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter is not blind: a per-module .item() (what the design forbids) is counted."""
    from mpdoctor.instrument.recorder import Recorder

    original = Recorder._record

    def reading_record(self, kind, mod, t, aux=-1):
        t.detach().float().abs().max().item()
        return original(self, kind, mod, t, aux)

    monkeypatch.setattr(Recorder, "_record", reading_record)
    bare = train_steps(make_net(), 3, host_reads)
    net = make_net()
    with mpdoctor.watch(net):
        watched = train_steps(net, 3, host_reads)
    assert watched[1] - bare[1] > 10


@pytest.fixture
def reductions(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts the per-module (torch.aminmax) and per-parameter (torch._foreach_norm)
    reductions the instrumentation launches."""
    from mpdoctor.instrument import patches

    monkeypatch.setattr(patches, "_WATCHERS", [])  # only the watchers of this test count
    counter = Counter()
    for name in ("aminmax", "_foreach_norm"):
        original = getattr(torch, name)

        def wrapper(*args, __original=original, __name=name, **kwargs):
            counter.n += 1
            counter.by_name[__name] = counter.by_name.get(__name, 0) + 1
            return __original(*args, **kwargs)
        monkeypatch.setattr(torch, name, wrapper)
    return counter


def test_every_4_reduces_on_2_of_8_steps(reductions: Counter) -> None:
    net = make_net()
    with mpdoctor.watch(net, every=4) as h:
        per_step = train_steps(net, 8, reductions)
        assert h.every == 4 and h.step == 7 and not h.internal_errors
    assert [i for i, n in enumerate(per_step) if n] == [0, 4], per_step
    full = make_net()
    with mpdoctor.watch(full):
        every_step = train_steps(full, 8, reductions)
    assert all(n == every_step[0] for n in every_step) and per_step[4] == every_step[4]


def test_env_variable_sets_the_period_of_mpdoctor_runs_watcher(reductions: Counter,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mpdoctor.instrument import patches
    from mpdoctor.instrument.recorder import Recorder

    monkeypatch.setenv("MPDOCTOR_WATCH_EVERY", "3")
    net = make_net()
    w = Recorder(auto=True)  # what `mpdoctor run` starts in the child (instrument/auto.py)
    patches.register(w)
    w.attach_module(net)
    try:
        per_step = train_steps(net, 7, reductions)
    finally:
        w.close()
    assert w.every == 3 and [i for i, n in enumerate(per_step) if n] == [0, 3, 6]
    with mpdoctor.watch(make_net()) as h:  # watch() in the user's own code samples only when asked
        assert h.every == 1
    monkeypatch.setenv("MPDOCTOR_WATCH_EVERY", "often")  # a wrong value must not stop the training
    assert Recorder(auto=True).every == 1


def test_every_must_be_a_positive_integer() -> None:
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(ValueError, match="positive integer"):
            mpdoctor.watch(make_net(), every=bad)


def test_nan_on_a_sampled_step_is_localised() -> None:
    net = make_net()
    with mpdoctor.watch(net, every=4) as h:
        train_steps(net, 8, scaler=torch.amp.GradScaler("cpu"), poison={4})
        found = h.findings()
    nf = h.first_nonfinite
    assert (nf.module, nf.phase, nf.step, nf.origin) == ("1.fc", "forward", 4, "module")
    assert found[0].category == "non-finite-values" and found[0].facts["module"] == "1.fc"


def test_nan_from_an_unsampled_step_on_is_localised_on_the_next_step() -> None:
    """The loss (read every step) shows the NaN; every step is watched from then on."""
    net = make_net()
    with mpdoctor.watch(net, every=4) as h:
        train_steps(net, 8, scaler=torch.amp.GradScaler("cpu"), poison={5, 6, 7})
    nf = h.first_nonfinite
    assert (nf.module, nf.phase, nf.step) == ("1.fc", "forward", 6)


def test_a_transient_nan_on_an_unsampled_step_is_reported_at_the_loss() -> None:
    net = make_net()
    with mpdoctor.watch(net, every=4) as h:
        train_steps(net, 8, scaler=torch.amp.GradScaler("cpu"), poison={5})
    nf = h.first_nonfinite
    assert (nf.module, nf.step, nf.origin) == ("(loss)", 5, "loss")


def test_steps_not_sampled_leave_the_submodules_without_hooks() -> None:
    """With watch(model, every=N) the submodules' hooks are removed on the steps that
    are not sampled (a model with thousands of modules then pays no hook call there)."""
    net = make_net()
    hooked = []
    net[2].register_forward_pre_hook(lambda m, a: hooked.append(len(net[1].fc._forward_hooks)))
    with mpdoctor.watch(net, every=4) as h:
        train_steps(net, 6)
    assert hooked == [1, 0, 0, 0, 1, 0]
    assert not any(m._forward_pre_hooks for m in net.modules() if m is not net[2]) and not h._module_hooks


def test_an_error_on_a_step_not_sampled_still_names_its_module() -> None:
    net = make_net()
    with mpdoctor.watch(net, every=4) as h:
        train_steps(net, 5)
        net[3].fc.half()  # step 5 is not sampled: its submodules have no hooks
        with pytest.raises(RuntimeError, match="dtype"):
            net(torch.randn(8, 16))  # no autocast: float32 into a float16 Linear
    err = h.errors[0]
    assert (err.module, err.module_type, err.step) == ("3.fc", "Poisonable", 5)
    assert err.context["params"] == {"float16@cpu": 2}
    assert [i["dtype"] for i in err.context["inputs"]] == ["float32"]
