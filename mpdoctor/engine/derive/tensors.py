"""Tensor dtypes and devices as messages spell them, normalised to one name each.

PyTorch names one dtype many ways depending on the message and the platform
(`Half`, `struct c10::Half`, `torch.cuda.HalfTensor`...): mpdoctor/knowledge/dtypes.py
reads them all. Rules read the raw spelling into a fact whose name
starts with an underscore (`_input`, `_weight`, `_a`) and this deriver turns each into
clean facts without the underscore:

- a tensor type name (`torch.cuda.HalfTensor`) gives `<name>_dtype` and `<name>_device`;
- a dtype name (`c10::Half`) gives `<name>` (and `<name>_dtype`);
- a device (`cuda:0`) gives `<name>` (and `<name>_device`).

Then it compares the first pair it finds (`dtypes`, `half_dtype`, `wide_dtype`,
`devices`, `gpu_device`, `cpu_side`) so that explanations can say which side is which.
Pure functions, never raising.
"""

from __future__ import annotations

import re
from typing import Any

from ...knowledge.dtypes import dtype_name, tensor_type
from . import deriver
from .fit import FIT_FACTS, fit

HALF_DTYPES = ("float16", "bfloat16")
WIDE_DTYPES = ("float32", "float64")

_DEVICE = re.compile(r"^(?P<type>cuda|cpu|mps|xpu|meta|hip|npu|xla|privateuseone)(?::(?P<index>\d+))?$", re.IGNORECASE)


def device_name(text: str | None) -> str | None:
    """'CUDA:0' -> 'cuda:0'; 'cpu' -> 'cpu'; None when it is not a device."""
    if not text:
        return None
    s = str(text).strip().strip("'\"`!.,")
    if s.isdigit():  # "device 1 does not equal 0" (torch 1.x): CUDA ordinals
        return f"cuda:{s}"
    if s.upper() in ("GPU", "CUDA"):
        return "cuda"
    m = _DEVICE.match(s)
    if not m:
        return None
    kind = m.group("type").lower()
    return f"{kind}:{m.group('index')}" if m.group("index") is not None else kind


def _device_kind(dev: str) -> str:
    return dev.split(":")[0]


# ATen kernel / wrapper names as messages print them -> the op a user wrote.
_OP_OF_METHOD = re.compile(r"^(?:wrapper_(?:CUDA_|CPU_|MPS_)?_?|_th_|_thnn_|_cudnn_|cudnn_)?(?P<op>[a-z][a-z0-9_]*?)(?:_forward|_out|_impl)?_?$")
_OP_KIND: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?:addmm|mm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot)$"), "a matrix multiply (nn.Linear, torch.matmul or @)"),
    (re.compile(r"^(?:index_select|embedding|embedding_backward|gather|take)$"), "an embedding lookup or indexing (nn.Embedding, index_select, gather)"),
    (re.compile(r"conv|convolution"), "a convolution"),
    (re.compile(r"^(?:cat|stack|concat)$"), "torch.cat/stack"),
    (re.compile(r"norm"), "a normalisation layer"),
    (re.compile(r"^(?:scaled_dot_product_attention|_scaled_dot_product\w*)$"), "scaled_dot_product_attention"),
    (re.compile(r"^(?:where|masked_fill|masked_scatter|index_put|index_add|index_copy|scatter\w*)$"), "an indexed write or masked op"),
]


def op_of(method: str | None) -> str | None:
    """'wrapper_CUDA_addmm' -> 'addmm'; 'wrapper__index_select' -> 'index_select';
    '_thnn_conv2d_forward' -> 'conv2d'; 'cudnn_convolution_backward_input' -> as is."""
    if not method:
        return None
    m = _OP_OF_METHOD.match(str(method).strip())
    return m.group("op") if m else None


def op_kind(op: str | None) -> str | None:
    if not op:
        return None
    for rx, kind in _OP_KIND:
        if rx.search(op):
            return kind
    return None


@deriver("tensors", facts=("a", "a_cpu", "a_device", "a_dtype", "a_half", "a_wide", "b", "b_cpu", "b_device", "b_dtype", "b_half", "b_wide", "both_half", "c", "c_dtype", "c_wide", "cpu_side", "destination", "destination_dtype", "destination_half", "device_differs", "devices", "double_operand", "dtype_differs", "dtypes", "expected", "expected_cpu", "expected_device", "expected_dtype", "expected_half", "expected_wide", "found", "found_device", "found_dtype", "found_half", "found_wide", "fp8_dtype", "got", "got_cpu", "got_device", "gpu_device", "half_dtype", "indices_device", "indices_dtype", "indices_half", "indices_wide", "input", "input_cpu", "input_device", "input_dtype", "input_half", "input_wide", "key", "key_dtype", "key_wide", "mask", "mask_dtype", "meta_device", "op", "op_kind", "param", "param_cpu", "param_device", "param_dtype", "param_half", "param_wide", "query", "query_dtype", "query_half", "query_wide", "source", "source_dtype", "source_wide", "target", "target_dtype", "target_half", "two_gpus", "value", "value_dtype", "value_half", "wide_dtype"))
def tensors(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dtypes: list[str] = []
    devices: list[str] = []
    for key, value in facts.items():
        if not key.startswith("_") or key.startswith("__") or value in (None, ""):
            continue
        name = key[1:]
        tt = tensor_type(value)
        if tt is not None:
            out[f"{name}_dtype"], out[f"{name}_device"] = tt
            dtypes.append(tt[0])
            devices.append(tt[1])
            continue
        dt = dtype_name(value)
        if dt is not None:
            out[name] = dt
            out.setdefault(f"{name}_dtype", dt)
            dtypes.append(dt)
            continue
        dev = device_name(value)
        if dev is not None:
            out[name] = dev
            out.setdefault(f"{name}_device", dev)
            devices.append(dev)
    pairs = [k[:-len("_dtype")] for k in out if k.endswith("_dtype")]
    # Per side, so that a sentence can render only for the side that is half (when the
    # other side is not half too) or wide.
    n_half = sum(out[f"{name}_dtype"] in HALF_DTYPES for name in pairs)
    for name in pairs:
        d = out[f"{name}_dtype"]
        if d in HALF_DTYPES and n_half == 1:
            out[f"{name}_half"] = d
        elif d in WIDE_DTYPES:
            out[f"{name}_wide"] = d
        elif d.startswith("float8"):
            out["fp8_dtype"] = d
    for name in [k[:-len("_device")] for k in list(out) if k.endswith("_device")]:
        if _device_kind(str(out[f"{name}_device"])) == "cpu":
            out[f"{name}_cpu"] = "cpu"
    if len(pairs) >= 2:
        a, b = pairs[0], pairs[1]
        if out[f"{a}_dtype"] != out[f"{b}_dtype"]:
            out["dtype_differs"] = f"{out[f'{a}_dtype']} vs {out[f'{b}_dtype']}"
        da, db = out.get(f"{a}_device"), out.get(f"{b}_device")
        if da and db and da != db:
            out["device_differs"] = f"{da} vs {db}"
    op = op_of(facts.get("method")) or (str(facts["op"]) if facts.get("op") else None)
    if op:
        out["op"] = op
        kind = op_kind(op)
        if kind:
            out["op_kind"] = kind
    distinct_dtypes = list(dict.fromkeys(dtypes))
    if distinct_dtypes:
        out["dtypes"] = " and ".join(distinct_dtypes)
    halves = [d for d in distinct_dtypes if d in HALF_DTYPES]
    wides = [d for d in distinct_dtypes if d in WIDE_DTYPES]
    if halves:
        out["half_dtype"] = halves[0]
    if wides:
        out["wide_dtype"] = wides[0]
    if len(halves) == 2:
        out["both_half"] = "float16 and bfloat16"
    if "float64" in distinct_dtypes and len(distinct_dtypes) > 1:
        out["double_operand"] = "float64"  # autocast never casts float64: the fix is at its source
    distinct_devices = list(dict.fromkeys(devices))
    if distinct_devices:
        out["devices"] = " and ".join(distinct_devices)
    gpus = [d for d in distinct_devices if _device_kind(d) not in ("cpu", "meta")]
    if gpus:
        out["gpu_device"] = gpus[0]
    if len(gpus) >= 2 and len({_device_kind(d) for d in gpus}) == 1 and "cpu" not in distinct_devices:
        out["two_gpus"] = " and ".join(gpus[:2])
    if gpus and "cpu" in [_device_kind(d) for d in distinct_devices]:
        out["cpu_side"] = "cpu"
    if "meta" in distinct_devices:
        out["meta_device"] = "meta"
    if len(distinct_dtypes) >= 2 and len(hits) > 1:
        out["occurrences"] = len(hits)
    return out


# --- non-finite values -----------------------------------------------------------------

# Backward functions whose gradient is infinite/undefined at a point a training run can
# reach, with the usual guard. (Anomaly mode names the backward of the forward op.)
_SINGULAR_GRADS: dict[str, str] = {
    "sqrt": "the gradient of sqrt is infinite at 0: use `torch.sqrt(x + eps)` or `x.clamp_min(eps).sqrt()`",
    "rsqrt": "the gradient of rsqrt is infinite at 0: add an epsilon inside (`torch.rsqrt(x + eps)`)",
    "pow": "x ** p with p < 1 (or a fractional power of a value that can be 0 or negative) has an infinite or NaN gradient: clamp the base (`x.clamp_min(eps) ** p`)",
    "norm": "the gradient of a norm is NaN when the vector is all zeros: use `F.normalize(x, eps=...)` or `torch.linalg.vector_norm(x + eps)`",
    "linalgvectornorm": "the gradient of a norm is NaN when the vector is all zeros: add an epsilon",
    "div": "a division by zero (or by a value that underflowed to 0 in fp16): add an epsilon to the denominator",
    "log": "log(0) = -inf: use `torch.log(x + eps)`, `torch.log1p`, or work with logits (`log_softmax`, `BCEWithLogitsLoss`)",
    "acos": "acos/asin have infinite gradients at ±1: clamp the input to `[-1 + eps, 1 - eps]`",
    "asin": "acos/asin have infinite gradients at ±1: clamp the input to `[-1 + eps, 1 - eps]`",
    "atan2": "atan2(0, 0) has an undefined gradient: add an epsilon",
    "logsoftmax": "log_softmax of a row that is all -inf (a fully masked attention row) is NaN: make sure every row keeps one unmasked position",
    "softmax": "softmax of a row that is all -inf (a fully masked row) is NaN: make sure every row keeps one unmasked position",
    "exp": "exp overflows to inf for large inputs (in fp16 already above ~11): compute it in float32 or subtract the maximum first",
}


# The largest finite values of the dtypes a diverging run meets: a logged loss or
# gradient norm close to one of them says whose range was used up.
FP16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38  # float32's is 3.4028e38: the same order


def _share(value: float, limit: float) -> str:
    share = 100 * value / limit
    return f"{share:.0f}%" if share >= 1 else f"{share:.1g}%"


def magnitudes(facts: dict[str, Any]) -> dict[str, Any]:
    """The large finite loss / gradient norm the log printed (context groups `_big_loss`,
    `_big_grad_norm`: the first value of at least 1e4), and its share of float16's and
    bfloat16's largest finite values, when it is near one of them."""
    out: dict[str, Any] = {}
    for key, name in (("_big_loss", "big_loss"), ("_big_grad_norm", "big_grad_norm")):
        raw = str(facts.get(key) or "").strip()
        try:
            value = float(raw)
        except ValueError:
            continue
        if not (value == value) or value in (float("inf"), float("-inf")) or abs(value) < 1e4:
            continue
        out[name] = raw
        if abs(value) <= FP16_MAX:
            out[f"{name}_fp16"] = _share(abs(value), FP16_MAX)
        elif abs(value) >= 1e36:
            out[f"{name}_bf16"] = _share(abs(value), BF16_MAX)
        else:
            out[f"{name}_over_fp16"] = f"{abs(value) / FP16_MAX:.3g}"
    if any(k.endswith("_bf16") for k in out):
        out["_range_reached"] = "yes"  # bf16's and fp32's range: switching to bf16 cannot help
    out["_bf16_ok"] = "ok"  # a code: the rule says whether bf16 advice fits ([words._bf16_ok])
    return out


MAGNITUDE_FACTS = ("_bf16_ok", "_range_reached", "big_grad_norm", "big_grad_norm_bf16", "big_grad_norm_fp16", "big_grad_norm_over_fp16",
                   "big_loss", "big_loss_bf16", "big_loss_fp16", "big_loss_over_fp16")


@deriver("nonfinite", facts=("forward_op", "occurrences", "op_hint", "values_seen") + FIT_FACTS + MAGNITUDE_FACTS)
def nonfinite(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fn = facts.get("function")
    if fn:
        m = re.match(r"^(?P<op>[A-Za-z0-9_]+?)Backward\d*$", str(fn))
        if m:
            op = m.group("op")
            out["forward_op"] = op
            hint = _SINGULAR_GRADS.get(op.lower().replace("_", ""))
            if hint:
                out["op_hint"] = hint
    if len(hits) > 1:
        out["occurrences"] = len(hits)
        values = list(dict.fromkeys(str(h.get("value")) for h in hits if h.get("value")))
        if len(values) > 1:
            out["values_seen"] = ", ".join(values)
    out.update(magnitudes(facts))
    out.update(fit(facts))
    return out
