"""Tensor dtypes, one name each, however they are spelled.

PyTorch names one dtype many ways depending on the message and the platform:
`Half`, `c10::Half`, `struct c10::Half` (MSVC), `at::Half`, `torch.cuda.HalfTensor`,
`CUDAHalfType`, `torch.float16`. mpdoctor names it as a torch.dtype prints, without
"torch.": `float16`. The instrumentation imports this module inside the user's
training process, so it depends on `re` only.
"""

from __future__ import annotations

import re

# Every spelling PyTorch (and C++ compilers' type printers) uses, lower-cased, without
# namespaces and "struct "/"class " prefixes.
_ALIASES: dict[str, str] = {
    "half": "float16", "float16": "float16", "fp16": "float16", "__half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16", "__nv_bfloat16": "bfloat16",
    "float": "float32", "float32": "float32", "fp32": "float32", "single": "float32",
    "double": "float64", "float64": "float64", "fp64": "float64",
    "long": "int64", "int64": "int64", "long int": "int64", "int64_t": "int64", "longlong": "int64",
    "int": "int32", "int32": "int32", "int32_t": "int32",
    "short": "int16", "int16": "int16",
    "char": "int8", "int8": "int8", "signed char": "int8",
    "byte": "uint8", "uint8": "uint8", "unsigned char": "uint8",
    "bool": "bool",
    "complexfloat": "complex64", "complex64": "complex64",
    "complexdouble": "complex128", "complex128": "complex128",
    "complexhalf": "complex32", "complex32": "complex32",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
}
# What a torch.dtype object prints: answered with one lookup (the watcher's path).
_TORCH_PRINTED = {f"torch.{name}": name for name in set(_ALIASES.values())}
# A dtype torch adds later (float8_e8m0fnu, float4_e2m1fn_x2, uint16, quint4x2, bits8):
# its name is kept as it is.
_NEW_DTYPE = re.compile(r"(?:b?float|u?int|complex|qu?int|bits)\d[a-z0-9_]*")
_PREFIX = re.compile(r"^(?:(?:struct|class)\s+)?(?:(?:c\s?10|at|torch|caffe2|std)\s?::\s?)?(?:torch\.)?")

# torch.cuda.HalfTensor, torch.HalfTensor, torch.xpu.FloatTensor
_TORCH_TENSOR_TYPE = re.compile(
    r"^torch\.(?:(?P<dev>cuda|xpu|mps|hip|npu)\.)?(?P<t>[A-Za-z0-9]+?)Tensor$"
)
# CUDAHalfType, CPUFloatType, MPSFloatType, CUDAFloatTensor (torch 1.0 wording)
_BACKEND_TYPE = re.compile(r"^(?P<dev>CUDA|CPU|MPS|XPU|HIP|Meta)(?P<t>[A-Za-z0-9]+?)(?:Type|Tensor)$")


def dtype_name(value: object) -> str | None:
    """torch.float16 (the object), 'torch.float16', 'Half', 'struct c10::Half',
    'c10::BFloat16', 'torch.cuda.HalfTensor', 'CUDAHalfType' -> 'float16' / 'bfloat16'...;
    None when `value` is not a dtype. A torch.dtype object always gets its printed name
    without "torch.", in one dictionary lookup."""
    if value is None:
        return None
    s = str(value)
    name = _TORCH_PRINTED.get(s)
    if name is not None:
        return name
    s = s.strip().strip("'\"`")
    tt = tensor_type(s)
    if tt is not None:
        return tt[0]
    s = _PREFIX.sub("", s).lower()
    name = _ALIASES.get(s)
    if name is not None:
        return name
    return s if _NEW_DTYPE.fullmatch(s) else None


def tensor_type(text: str | None) -> tuple[str, str] | None:
    """'torch.cuda.HalfTensor' -> ('float16', 'cuda'); 'torch.FloatTensor' -> ('float32', 'cpu');
    'CUDABFloat16Type' -> ('bfloat16', 'cuda'). None when it is not a tensor type name."""
    if not text:
        return None
    s = str(text).strip().strip("'\"`")
    m = _TORCH_TENSOR_TYPE.match(s) or _BACKEND_TYPE.match(s)
    if not m:
        return None
    dtype = _ALIASES.get(m.group("t").lower())
    if dtype is None:
        return None
    return dtype, (m.group("dev") or "cpu").lower()
