"""The installed torch raises these errors for real (on CPU); the rules must read the
message torch actually prints, not only the forms pasted in old issues."""

from __future__ import annotations

import traceback

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from mpdoctor import rulebase
from mpdoctor.logs import explain_text  # noqa: E402


def _raised(fn) -> str:
    try:
        fn()
    except Exception:  # the log a user would paste: the whole traceback
        return traceback.format_exc()
    raise AssertionError("expected torch to raise")


def _unscale_fp16():
    p = nn.Parameter(torch.randn(2, dtype=torch.float16))
    p.grad = torch.randn(2, dtype=torch.float16)
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    loss = (p.float() ** 2).sum()
    scaler.scale(loss)  # the scale exists, as in a real step
    scaler.unscale_(opt)


def _anomaly_nan():
    with torch.autograd.detect_anomaly():
        x = torch.zeros(2, requires_grad=True)
        (x.sqrt() * 0).sum().backward()


def _clip_nonfinite():
    p = nn.Parameter(torch.randn(2))
    p.grad = torch.tensor([float("inf"), 1.0])
    torch.nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


CASES = [
    ("matmul-operands-dtype", lambda: torch.mm(torch.randn(2, 4, dtype=torch.float16), torch.randn(4, 3))),
    ("matmul-operands-dtype", lambda: F.linear(torch.randn(2, 4), torch.randn(3, 4, dtype=torch.bfloat16))),
    ("expected-scalar-type", lambda: torch.bmm(torch.randn(1, 2, 4, dtype=torch.float16), torch.randn(1, 4, 3))),
    ("input-weight-dtype", lambda: nn.Conv2d(3, 4, 3)(torch.randn(1, 3, 8, 8, dtype=torch.bfloat16))),
    ("input-weight-dtype", lambda: nn.LSTM(4, 4)(torch.randn(2, 1, 4, dtype=torch.float16))),
    ("index-put-source-dtype", lambda: torch.zeros(4, dtype=torch.float16).__setitem__(torch.tensor([0, 1]), torch.ones(2))),
    ("attention-qkv-dtype", lambda: F.scaled_dot_product_attention(
        torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4, dtype=torch.bfloat16), torch.randn(1, 1, 2, 4, dtype=torch.bfloat16))),
    ("embedding-indices-float", lambda: nn.Embedding(10, 4)(torch.tensor([1.0, 2.0]))),
    ("value-overflows-half", lambda: torch.zeros(2, dtype=torch.float16).fill_(1e9)),
    ("mask-constant-overflows-half", lambda: torch.zeros(2, dtype=torch.float16).masked_fill(torch.tensor([True, False]), -1e9)),
    ("tensors-on-different-devices", lambda: torch.randn(2, device="meta") + torch.randn(2)),
    ("unscale-fp16-gradients", _unscale_fp16),
    ("anomaly-backward-nan", _anomaly_nan),
    ("multinomial-invalid-probabilities", lambda: torch.multinomial(torch.tensor([float("nan"), 1.0]), 1)),
    ("clip-grad-norm-nonfinite", _clip_nonfinite),
]


@pytest.mark.filterwarnings("ignore::UserWarning")  # anomaly mode warns by design
@pytest.mark.parametrize("rule, fn", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_real_message_is_diagnosed(rule, fn):
    log = _raised(fn)
    report = explain_text(log, rulebase.load())
    top = [f.rule for f in report.findings][:1]
    assert top == [rule], f"{top} for:\n{log.splitlines()[-1]}"
    assert report.findings[0].facts, "facts should be read out of the message"
