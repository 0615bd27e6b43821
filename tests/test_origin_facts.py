"""Issue 19 item 2, in process and from recorded runs: which tensor was odd and what made it.

The watcher is real (global hooks on real torch modules, on the CPU); the failures are the
real torch errors. What is asserted is what the recorder keeps (`context["origin"]`) and
what a user reads (the finding's first fix, judged by the rule base on the recorded runs
of fixtures/events/origin-*.json).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from mpdoctor import rulebase  # noqa: E402
from mpdoctor.diagnosis.run import events_case  # noqa: E402
from mpdoctor.instrument.recorder import watch  # noqa: E402
from mpdoctor.run.evidence import origin_facts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "fixtures" / "events"


def _origin(w) -> dict:
    assert w.errors, "the watcher recorded no error"
    return w.errors[0].context.get("origin") or {}


def test_the_output_of_a_float64_module_is_named_with_the_module_and_its_parameters() -> None:
    teacher = nn.Linear(4, 8).double()
    fuse = nn.Linear(8, 2)
    with watch() as w:
        x = torch.randn(3, 4)
        t_feat = teacher(x.double())
        with pytest.raises(RuntimeError, match="same dtype"):
            fuse(t_feat)
    o = _origin(w)
    assert (o["kind"], o["module"], o["dtype"], o["variable"]) == ("module-output", "teacher", "float64", "t_feat")
    assert o["module_params"] == {"float64": 2}
    assert o["cast"] == ".double()" and o["code"] == "t_feat = teacher(x.double())"


def test_a_buffer_left_on_meta_is_the_odd_tensor_of_a_device_mismatch() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4), persistent=False)

        def forward(self, x):
            return self.proj(x) * self.scale

    with torch.device("meta"):
        model = nn.Sequential(Scaled())
    model.load_state_dict(nn.Sequential(Scaled()).state_dict(), assign=True)
    with watch() as w:
        with pytest.raises(RuntimeError, match="meta"):
            model(torch.randn(2, 4))
    o = _origin(w)
    assert (o["kind"], o["tensor"], o["device"], o["differs"], o["against"]) == ("buffer", "0.scale", "meta",
                                                                                 "device", "cpu")
    assert o["persistent"] is False
    assert origin_facts({"context": {"origin": o}})["origin"] == "buffer-unloaded"


class _Float32Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.sigmoid(x.float())

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_custom_function_that_returns_float32_under_autocast_is_named() -> None:
    class Pool(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x, idx):
            h = self.proj(x)
            gated = _Float32Gate.apply(h)
            return torch.zeros(2, 4, dtype=h.dtype).index_add_(0, idx, gated)

    with watch() as w, torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="index_add_"):
            Pool()(torch.randn(4, 4), torch.tensor([0, 0, 1, 1]))
    o = _origin(w)
    assert (o["kind"], o["function"], o["variable"], o["dtype"], o["against"]) == (
        "function-output", "_Float32Gate", "gated", "float32", "bfloat16")
    assert o["function_at"].startswith("test_origin_facts.py:")


def test_a_float64_tensor_made_by_a_cast_outside_any_module_is_traced_to_its_line() -> None:
    head = nn.Linear(4, 2)
    with watch() as w:
        feats = head(torch.randn(3, 4))
        weights = torch.ones(2).double()
        try:
            feats @ weights
        except RuntimeError as exc:
            w.on_exit_exception(exc)  # what the watcher does with an uncaught exception at exit
        else:
            pytest.fail("float32 @ float64 did not raise")
    o = _origin(w)
    assert (o["kind"], o["variable"], o["cast"], o["dtype"]) == ("cast", "weights", ".double()", "float64")
    facts = origin_facts({"context": {"origin": o}})
    assert (facts["fix_dtype"], facts["fix_cast"]) == ("float32", ".float()")


def test_nothing_odd_records_no_origin() -> None:
    lin = nn.Linear(4, 4)
    with watch() as w:
        with pytest.raises(RuntimeError, match="shape"):
            lin(torch.randn(2, 5))
    assert w.errors and "origin" not in w.errors[0].context


@pytest.mark.parametrize("record", [{}, {"origin": "junk"}, {"origin": {"kind": "parameter"}},
                                    {"origin": {"dtype": "float16", "model_params": "x", "autocast": []}}])
def test_a_partial_or_odd_origin_record_gives_facts_or_none_never_an_error(record) -> None:
    facts = origin_facts({"context": record})
    assert isinstance(facts, dict)


# ---- the recorded runs, judged by the rule base -------------------------------------------
CASES = {
    "origin-class-weight-created": ("matmul-operands-dtype", ["`class_cost`", "float64_class_weight_bf16.py:35",
                                                              "torch.from_numpy(x).float()"]),
    "origin-frozen-teacher": ("matmul-operands-dtype", ["`teacher.float()`", "`.double()`",
                                                        "frozen_teacher_distill.py:71"]),
    "origin-double-cast": ("matmul-operands-dtype", ["`.double()`", "double_cast_in_forward.py:34", "`scores.float()`"]),
    "origin-huber-target": ("dtype-mismatch-in-backward", ["`y`", "double_target_huber.py:32", ".float()"]),
    "origin-trainer-half-model": ("mixed-dtype-cpu", ["`model.float()`", "bfloat16 autocast"]),
    "origin-custom-function": ("index-put-source-dtype", ["`SafeGate.forward`", "custom_function_fp32_bf16.py:32",
                                                          "`return out.to(x.dtype)`"]),
    "origin-meta-buffer": ("tensors-on-different-devices", ["`encoder.pos_scale`", "load_state_dict"]),
}


@pytest.fixture(scope="module")
def rules():
    return rulebase.load()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_first_fix_names_the_odd_tensor_and_the_change(rules, name) -> None:
    rule, words = CASES[name]
    findings = events_case(str(EVENTS / f"{name}.json"), rules)
    f = findings[0]
    assert f.rule == rule
    for w in words:
        assert w in f.fixes[0], (w, f.fixes[0])
    assert f.facts.get("odd_tensor")
    said = " ".join([f.title, f.explanation, *f.fixes])
    # fixes that fit this CPU, bf16 run: no CUDA autocast, no float16 cast of a bf16 model
    assert 'torch.autocast("cuda"' not in said and "model.to(torch.float16)" not in said


def test_the_explanation_says_who_made_the_frozen_teachers_features(rules) -> None:
    f = events_case(str(EVENTS / "origin-frozen-teacher.json"), rules)[0]
    assert "the output of `teacher` (Linear; its parameters: 2× float64), which was never passed to " \
           "`accelerator.prepare` and is not in the optimizer" in f.explanation


def test_a_nan_made_by_an_already_broken_weight_names_the_weight(rules) -> None:
    f = events_case(str(EVENTS / "origin-half-head-param.json"), rules)[0]
    assert f.rule == "half-params-updated-directly"
    assert (f.facts["odd_tensor"], f.facts["odd_dtype"]) == ("head.weight", "float16")
    assert "`head.weight` (float16) already held NaN" in f.explanation
