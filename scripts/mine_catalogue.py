"""Mine the error and warning messages the libraries can emit, into catalogue/<library>.toml.

    python scripts/mine_catalogue.py                       # the installed packages
    python scripts/mine_catalogue.py --repo deepspeed=/work/.mirror/deepspeedai+DeepSpeed/repo
    python scripts/mine_catalogue.py --only torch --cudart .../libcudart.so.12 --cudart-version 12.9.79

The public repositories mined (REPOS below names each, with its version file): DeepSpeed,
bitsandbytes, peft, diffusers, xformers, flash-attn, torchao, Transformer Engine, ComfyUI,
NCCL (its WARN lines and ncclGetErrorString), ROCm clr (hipGetErrorString, its LogPrintfError
lines); the CUDA runtime's cudaGetErrorString texts from the libcudart.so a PyPI wheel ships.

Sources, each read as code, never run:
- Python: the string (or f-string, "...".format, "..." % x) given to `raise X(...)`,
  `warnings.warn(...)`, `logger.warning/error(...)`, `rank_zero_warn(...)`, `warn_once(...)`;
  a placeholder (an f-string field, `{name}`, `%s`) becomes `{}`;
- C++ headers shipped with torch (torch/include): TORCH_CHECK, TORCH_CHECK_*, AT_ERROR,
  TORCH_WARN, TORCH_WARN_ONCE, TORCH_INTERNAL_ASSERT message parts (string literals joined,
  other arguments as `{}`);
- a public repository's git directory (`--repo NAME=GITDIR`, a `fetch`ed snapshot): its
  Python and C/C++/CUDA files at HEAD (`git show`), with the libraries' own check macros
  (NVTE_CHECK/NVTE_ERROR, NCCL's WARN, HIP's LogPrintfError) and error-string tables;
- libcudart.so (`--cudart`): the runtime's error strings.

Each message is labelled by `classify()` (keyword rules for the categories of
docs/categories.md; anything else is "not ours"), then by catalogue/review.toml (a
person's corrections, keyed by library and template). The files are data: the coverage
command (`mpdoctor rules coverage`) and tests/test_catalogue.py read them, never this script.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "catalogue"

# library -> (distribution name, package folders under site-packages)
INSTALLED = {
    "torch": ("torch", ["torch"]),
    "accelerate": ("accelerate", ["accelerate"]),
    "transformers": ("transformers", ["transformers"]),
    "lightning": ("lightning", ["lightning", "pytorch_lightning", "lightning_fabric"]),
}
SKIP_DIRS = re.compile(r"/(tests?|testing|_vendor|vendor|benchmarks?|examples?|docs?|_dynamo|_inductor|onnx|"
                       r"_export|export|fx|jit|utils/hipify|_functorch|distributed/_shard|models/[a-z0-9_]+)/")
WARN_CALLS = {"warn", "warning", "warn_once", "warning_once", "rank_zero_warn", "rank_zero_warning",
              "error", "critical", "warning_advice", "rank_zero_deprecation", "_warn"}


# --- Python -----------------------------------------------------------------------------------

def _str_of(node: ast.AST) -> str | None:
    """The template of a message expression, or None when it holds no literal text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value).replace("{", "{{").replace("}", "}}"))
            else:
                out.append("{}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _str_of(node.left), _str_of(node.right)
        if a is None and b is None:
            return None
        return (a if a is not None else "{}") + (b if b is not None else "{}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        a = _str_of(node.left)
        if a is None:
            return None
        return re.sub(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgixXe]", "{}", a)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"):
        a = _str_of(node.func.value)
        if a is None:
            return None
        return re.sub(r"\{\{[^{}]*\}\}", "{}", a)
    return None


def _template(text: str) -> str:
    """Literal braces back to single ones; runs of whitespace to one space."""
    text = text.replace("{{}}", "{}")
    text = re.sub(r"\{\{([^{}]*)\}\}", r"{\1}", text) if "{{" in text else text
    return re.sub(r"\s+", " ", text).strip()


def _exc_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else node
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return "Exception"


def mine_python(source: str, rel: str) -> list[dict]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        kind, msg_node = None, None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            kind, msg_node = _exc_name(node.exc), node.exc.args[0]
        elif isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in WARN_CALLS:
                kind, msg_node = "warning", node.args[0]
                if name in {"error", "critical"}:
                    kind = "log-error"
                for kw in node.keywords:
                    if kw.arg == "category" and isinstance(kw.value, (ast.Name, ast.Attribute)):
                        kind = _exc_name(kw.value)
                if len(node.args) > 1 and isinstance(node.args[1], (ast.Name, ast.Attribute)) and name == "warn":
                    kind = _exc_name(node.args[1])
        if msg_node is None:
            continue
        text = _str_of(msg_node)
        if text is None:
            continue
        text = _template(text)
        if len(re.sub(r"\{\}|\W", "", text)) < 12:  # nothing but placeholders
            continue
        found.append({"template": text, "kind": kind, "source": f"{rel}:{node.lineno}"})
    return found


# --- C++ headers ------------------------------------------------------------------------------

CPP_MACRO = re.compile(r"\b(TORCH_CHECK(?:_[A-Z_]+)?|AT_ERROR|TORCH_WARN(?:_ONCE)?|TORCH_INTERNAL_ASSERT|"
                       r"NVTE_CHECK|NVTE_ERROR|NVTE_WARN|WARN|LogPrintfError|LogError)\s*\(")
CPP_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
NO_COND = {"AT_ERROR", "TORCH_WARN", "TORCH_WARN_ONCE", "NVTE_ERROR", "NVTE_WARN", "WARN", "LogPrintfError", "LogError"}
PRINTF = re.compile(r"%[-#0 +]*(?:\d+|\*)?(?:\.\d+)?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcsp]")
CPP_KIND = {"TORCH_CHECK_VALUE": "ValueError", "TORCH_CHECK_TYPE": "TypeError", "TORCH_CHECK_INDEX": "IndexError",
            "TORCH_CHECK_NOT_IMPLEMENTED": "NotImplementedError", "TORCH_WARN": "UserWarning",
            "TORCH_WARN_ONCE": "UserWarning", "NVTE_WARN": "UserWarning", "WARN": "log-error",
            "LogPrintfError": "log-error", "LogError": "log-error"}


def _args(text: str, start: int) -> list[str] | None:
    """The top-level comma-separated arguments of a call whose '(' is just before start."""
    depth, i, cur, out = 1, start, [], []
    while i < len(text) and i - start < 4000:
        c = text[i]
        if c == '"':
            m = CPP_STRING.match(text, i)
            if not m:
                return None
            cur.append(m.group(0))
            i = m.end()
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                out.append("".join(cur).strip())
                return out
        elif c == "," and depth == 1:
            out.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return None


OWN_MACROS = {"WARN": "nccl", "LogPrintfError": "rocm-hip", "LogError": "rocm-hip"}  # another library's WARN is not NCCL's


def mine_cpp(source: str, rel: str, library: str = "torch") -> list[dict]:
    found = []
    for m in CPP_MACRO.finditer(source):
        macro = m.group(1)
        if OWN_MACROS.get(macro, library) != library:
            continue
        if source[max(0, m.start() - 8):m.start()].rstrip().endswith("define"):
            continue
        args = _args(source, m.end())
        if not args:
            continue
        msg = args if macro in NO_COND else args[1:]
        if macro in PRINTF_MACROS:
            msg = msg[:1]  # the format; its arguments are its placeholders
        parts = []
        for a in msg:
            lits = CPP_STRING.findall(a)
            if lits and CPP_STRING.sub("", a).strip() == "":
                parts.append("".join(lits))
            else:
                parts.append("{}")
        text = re.sub(r"\s+", " ", "".join(parts).replace("\\n", " ").replace('\\"', '"')).strip()
        if macro in PRINTF_MACROS:
            text = PRINTF.sub("{}", text.replace("%%", "%"))
        if len(re.sub(r"\{\}|\W", "", text)) < 12:
            continue
        if macro == "WARN":  # NCCL's WARN: a log line "host:pid:tid [dev] NCCL WARN <message>"
            text = "{host}:{pid}:{tid} [{dev}] NCCL WARN " + text
        line = source.count("\n", 0, m.start()) + 1
        found.append({"template": text, "kind": CPP_KIND.get(macro, "RuntimeError"), "source": f"{rel}:{line}"})
    return found


PRINTF_MACROS = {"WARN", "LogPrintfError", "LogError"}
# an error-string table: `case ncclSystemError: return "unhandled system error ...";`
CASE_RETURN = re.compile(r'case\s+(\w+)\s*:\s*(?:\{\s*)?return\s+"((?:[^"\\\n]|\\.)+)"\s*;')
# how a runtime's error string reaches a user's log: torch and the libraries put it behind these words
TABLE_FORM = {"nccl": ("NCCL error in: {file}:{line}, ", ", NCCL version {version}",
                       "torch.distributed.DistBackendError"),
              "rocm-hip": ("HIP error: ", "", "torch.AcceleratorError")}


def mine_table(source: str, rel: str, library: str) -> list[dict]:
    """The messages of a runtime's error-string function (ncclGetErrorString, hipGetErrorString):
    every `case X: return "text";` whose text is words, not the enum's name."""
    before, after, kind = TABLE_FORM[library]
    found = []
    for f in ERROR_STRING_FN.finditer(source):
        end = source.find("\n}", f.end())
        found += _table(source, f.end(), end if end > 0 else len(source), rel, before, after, kind)
    return found


# the runtime's own function: ncclGetErrorString, hipGetErrorString / ihipGetErrorString (not a plugin's)
ERROR_STRING_FN = re.compile(r"\b(?:nccl|i?hip)GetErrorString\s*\([^)]*\)\s*\{")


def _table(source: str, start: int, end: int, rel: str, before: str, after: str, kind: str) -> list[dict]:
    found = []
    for m in CASE_RETURN.finditer(source, start, end):
        text = m.group(2).replace('\\"', '"')
        if " " not in text or len(re.sub(r"\W", "", text)) < 8:
            continue
        found.append({"template": before + text + after, "kind": kind, "name": m.group(1),
                      "source": f"{rel}:{source.count(chr(10), 0, m.start()) + 1}"})
    return found


def mine_cudart(path: str) -> list[dict]:
    """cudaGetErrorString's texts, read from the CUDA runtime library a wheel ships
    (nvidia-cuda-runtime-cu12: nvidia/cuda_runtime/lib/libcudart.so.12): the printable strings
    between its "no error" and "startup failure in cuda runtime" entries that are not an enum
    name, as torch prints them ("CUDA error: <text>")."""
    data = Path(path).read_bytes()
    strings = [b.decode("ascii") for b in re.findall(rb"[\x20-\x7e]{4,}", data)]
    try:
        start, end = strings.index("no error"), strings.index("startup failure in cuda runtime")
    except ValueError:
        raise SystemExit(f"{path}: no cudaGetErrorString table found") from None
    found, seen = [], set()
    for i, text in enumerate(strings[start + 1:end + 1], start + 1):
        if re.fullmatch(r"cuda\w+", text) or text in seen or " " not in text:
            continue
        seen.add(text)
        found.append({"template": "CUDA error: " + text, "kind": "torch.AcceleratorError",
                      "source": f"{Path(path).name}:string {i - start}"})
    return found


# --- classification ---------------------------------------------------------------------------

# (category, regex): the first that matches the template labels it; the order puts the
# specific before the generic. Each is a family of the message's meaning (memory, driver,
# kernel, device, dtype, communication words), not one library's sentence.
CLASSES = [
    ("amp-deprecated-api", r"torch\.cuda\.amp\.\w+\(args\.\.\.\) is deprecated|`?torch\.cuda\.amp\.\w+.{0,40}deprecated"),
    ("fp16-gradient-unscale", r"unscale FP16 gradients"),
    ("autocast-unsafe-op", r"unsafe to autocast"),
    ("fp16-value-overflow", r"without overflow"),
    ("host-out-of-memory", r"DefaultCPUAllocator|can't allocate memory|(?i:host memory|pinned memory|CPU memory)"
                           r".{0,40}(?:fail|exhaust|not enough|insufficient)|(?i:fail\w* (?:allocation|to allocate) "
                           r"host memory)"),
    ("out-of-memory", r"out of memory|OutOfMemory|CUBLAS_STATUS_ALLOC_FAILED|Allocation on device|"
                      r"(?i:(?:not enough|insufficient|no more) (?:GPU |device |free |VRAM )?memory|"
                      r"(?:couldn't|could not|cannot|can't|unable to|failed to) allocate (?:\w+ ){0,3}"
                      r"(?:memory|on (?:the )?device|buffer|workspace)|memory (?:allocation )?(?:exhausted|failure)|"
                      r"exceeds? (?:the )?(?:available|allowed|device|GPU) memory)"),
    ("no-kernel-image", r"no kernel image|not compatible with the current PyTorch installation|"
                        r"device kernel image is invalid|invalid device function|PTX JIT compilation failed|"
                        r"Unable to find code object|hipErrorNoBinaryForGpu|no binary for (?:the )?GPU"),
    ("driver-too-old", r"(?i:driver (?:on your system )?is too old|driver version is insufficient|"
                       r"update your (?:GPU |NVIDIA )?driver|PTX was compiled with an unsupported toolchain|"
                       r"not supported in the installed CUDA driver|unsupported display driver / cuda driver|"
                       r"forward compatibility was attempted|requires? (?:a )?newer (?:NVIDIA |CUDA |GPU )?driver|"
                       r"driver .{0,30}(?:older|too old) than)"),
    ("cuda-library-missing", r"cannot open shared object|libcudart|libnccl|libcudnn|undefined symbol|"
                             r"PTX JIT compiler library not found|(?i:CUDA Toolkit headers not found|"
                             r"could not (?:find|load|locate) (?:the )?(?:CUDA|cuDNN|cuBLAS|NCCL|NVRTC|nvJitLink) "
                             r"(?:library|runtime|toolkit))"),
    ("cuda-unavailable", r"not compiled with CUDA|No CUDA GPUs|Found no NVIDIA driver|CUDA is not available|"
                         r"requires a GPU\b(?! with)|no (?:CUDA|GPU) (?:device|available)|Cannot re-initialize (?:CUDA|XPU)|"
                         r"no (?:CUDA|ROCm)-capable device is detected|device\(s\) is/are busy or unavailable|"
                         r"invalid device ordinal|CUDA driver is a stub library|"
                         r"(?i:no (?:GPU|GPUs|accelerator) (?:found|detected|available))"),
    # fp8 refused by the hardware, the build or a missing backend (an fp8 kernel's internal argument
    # checks, "requires rowwise usage", are not a user's precision choice failing)
    ("fp8-unsupported", r"(?i:(?:\bfp8\b|float8|mxfp8|nvfp4|mxfp4|\bfp4\b|MS-AMP|msamp|TransformerEngine|"
                        r"transformer_engine).{0,80}(?:not supported (?:on|by) (?:this |the |your )?(?:GPU|device|"
                        r"hardware|architecture|platform|CPU|MPS|XPU)|(?:requires?|only supported on|only available on|"
                        r"needs?) (?:an? |the )?(?:\w+ ){0,2}(?:GPU|CUDA(?! tensors?)|device|Hopper|Blackwell|Ada|H100|sm_?\d|SM ?\d|"
                        r"compute capability|architecture)|compute capability|architectures? [<>]|\bsm_?\d{2,3}|"
                        r"\bSM ?\d{2,3}|Hopper|Blackwell|not installed|pip install|is not available|cannot be used)|"
                        r"(?:compute capability|\bsm_?\d{2,3}\+?|Hopper|Blackwell|install|requires a GPU).{0,80}"
                        r"(?:\bfp8\b|float8|mxfp8|nvfp4|MS-AMP|TransformerEngine|transformer_engine))"),
    ("bf16-unsupported", r"(?i)(?:bf16|bfloat16).{0,60}(?:not supported|only supported|requires|compute capability|native)"),
    ("flash-attention-unsupported", r"(?i)flash.?attention|flash_attn|No available kernel|scaled_dot_product|sdpa|"
                                    r"memory_efficient_attention|No operator found for"),
    ("fp16-unsupported-device", r"(?i)(?:fp16|half|float16).{0,60}(?:requires a GPU|only (?:be )?(?:supported|used|available) (?:on|with) (?:GPU|CUDA)|not supported on (?:CPU|MPS|XPU|TPU|this device))|"
                                r"does not support autocast"),
    ("half-op-not-implemented", r"not implemented for '?(?:Half|BFloat16)|\" not implemented for"),
    ("version-incompatible", r"(?i)requires? (?:cuBLAS|cuDNN|cuBLASLt|NCCL|CUDA) (?:version )?[<>=]*\s*\d|"
                             r"(?:cuBLAS|cuDNN) (?:version )?\d[\d.]*\+? (?:or (?:newer|later|above)|is required)"),
    # cuBLAS / cuDNN refusing or failing a call (a library's own shape checks around its GEMM are not)
    ("cublas-cudnn-failure", r"CUBLAS_STATUS|CUDNN_STATUS|cuDNN error|cublas\w* failed|cudnn\w* failed|"
                             r"(?i:Unable to find (?:a )?suitable cuBLAS|cuBLAS(?:Lt|Mp)? Error:|cuDNN Error:)"),
    ("cuda-kernel-fault", r"device-side assert|illegal memory access|illegal instruction|misaligned address|"
                          r"unspecified launch failure|hardware stack error|invalid program counter|"
                          r"launch timed out and was terminated|uncorrectable (?:ECC|NVLink) error|"
                          r"Invalid access of peer GPU memory|operation not supported on global/shared address space|"
                          r"too many resources requested for launch|page fault|PROTECTION_FAULT|"
                          r"(?i:GPU (?:has )?(?:fallen off the bus|hang|reset))"),
    ("loss-scale-overflow", r"(?i)loss scale|Gradient overflow|skipping step"),
    ("non-finite-values", r"(?i)\bnan\b|\binf\b.{0,30}(?:loss|grad|value)|non-finite|nonfinite|not finite"),
    ("distributed-communication", r"\bNCCL\b|\bnccl\b|\bgloo\b|Gloo|ProcessGroup|process group|collective|rendezvous|"
                                  r"Watchdog|\bHCCL\b|\bRCCL\b|all_reduce|allreduce|barrier|\bXCCL\b"),
    ("device-mismatch", r"(?i)same device|on the same device|different devices|device mismatch|expected device|"
                        r"to be on (?:the )?(?:same|cuda|cpu|device)|should be on|must be on (?:the )?(?:same|cuda|cpu)|"
                        r"must be (?:a |of type |on |on a |an? \w+ )?(?:CUDA|GPU)(?: tensors?| device)?\b|is_cuda|"
                        r"(?:only supports?|expects?|expected) (?:\w+ ){0,2}(?:CUDA|GPU) tensors?"),
    ("dtype-mismatch", r"(?i)same dtype|same data ?type|expected scalar type|dtype mismatch|must have the same (?:dtype|type)|"
                       r"expected (?:both|all) .{0,30}(?:dtype|type)|to have the same dtype|"
                       r"\b(?:Half|Float|BFloat16)Tensor\)|expected .{0,40}(?:dtype|type) .{0,20}(?:but|got)|"
                       r"has dtype=?.{0,10}, but expected dtype"),
    ("accelerate-config", r"(?i)(?:mixed_precision|mixed precision|deepspeed|fsdp|zero stage|zero_optimization|"
                          r"train_batch_size|micro_batch).{0,120}(?:must|cannot|can't|not supported|mismatch|"
                          r"requires|only|incompatible|conflict|should be|is not compatible)|"
                          r"(?:must|cannot|can't|not supported|mismatch|requires|only|incompatible|conflict).{0,120}"
                          r"(?:mixed_precision|mixed precision|deepspeed|fsdp|zero stage|train_batch_size|micro_batch)"),
    ("version-incompatible", r"(?i)requires (?:torch|pytorch|accelerate|transformers|deepspeed)\s*(?:>=|version)|"
                             r"(?:torch|PyTorch) (?:>=|version \d)|upgrade (?:torch|PyTorch)"),
]
CLASSES_RE = [(c, re.compile(r)) for c, r in CLASSES]
# words the fp16/bf16/memory/device/kernel/driver/communication families share: a message
# with none of them is not about this project's subject, whatever it says.
SUBJECT = re.compile(r"(?i)cuda|gpu|device|fp16|bf16|half|bfloat|float16|float8|fp8|dtype|precision|autocast|amp\b|"
                     r"scaler|memory|kernel|driver|nccl|gloo|hccl|distributed|rank|collective|cudnn|cublas|"
                     r"deepspeed|fsdp|flash|sdpa|attention|nan\b|overflow|\bmps\b|\bxpu\b|rocm|hip\b|triton|"
                     r"quantiz|int8|4bit|8bit|bitsandbytes|compute capability|sm_\d|allocat|launch|ptx|ecc\b|data ?type|"
                     r"nvlink|ampere|hopper|blackwell|mxfp|nvfp4|\bfp4\b|page fault|xccl")
# A fused-attention library's refusal of a GPU generation or a dtype is the kernel refusing
# (flash-attention-unsupported), wherever its sentence does not say "attention".
ATTENTION_LIBS = {"flash-attn", "xformers"}
REFUSAL = re.compile(r"(?i)(?:only supports?|requires?|is only supported|only (?:works|runs|available)|"
                     r"not supported|unsupported|needs?)\b.{0,60}(?:fp16|bf16|float16|bfloat16|half|Ampere|Hopper|"
                     r"Blackwell|Turing|Volta|Ada|\bsm_?\d{2,3}|\bSM ?\d{2,3}|compute capability|GPUs? or newer|"
                     r"GPU architecture|arch\b|gfx\d+)|(?:Ampere|Hopper|Turing|Blackwell|GPU) (?:GPUs? )?or newer")
ARCH = re.compile(r"(?i)(?:requires?|only (?:supports?|supported|available|runs|works)|not supported|unsupported|"
                  r"needs?)\b.{0,50}(?:\bsm_?\d{2,3}\+?|\bSM ?\d{2,3}\+?|compute capability|Ampere|Hopper|"
                  r"Blackwell|Ada|GPUs? or newer|gfx\d+)|(?i:Unsupported (?:compute capability|GPU architecture|arch))")
# an index or argument dtype (int32 sequence lengths, a bool mask) is the caller's argument, not precision
INDEX_DTYPE = re.compile(r"(?i)must (?:have|be of) (?:dtype|type) (?:torch\.)?(?:int32|int64|long|int|bool|uint8)\b|"
                         r"dtype (?:torch\.)?(?:int32|int64)\b")


# a deprecation says an API will change, not that anything failed (amp-deprecated-api, which is
# about precision, is matched before this is asked)
DEPRECATION = re.compile(r"(?i)\bdeprecat|will be removed in|is no longer (?:needed|required|recommended)")


def classify(template: str, library: str, kind: str = "") -> str:
    if not SUBJECT.search(template):
        return "not ours"
    if CLASSES_RE[0][1].search(template):
        return CLASSES_RE[0][0]
    if DEPRECATION.search(template) or kind in ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"):
        return "not ours"
    if kind == "AssertionError" and library == "torch":
        return "not ours"  # torch's internal invariants (assert x, "..."): no user's choice failed
    if re.search(r"(?i)is not installed|pip install|not available\. ?Please install|is required for|"
                 r"requires? (?:the )?\w+ (?:package|library) to be installed", template) \
            and not re.search(r"(?i)fp8|float8|TransformerEngine|transformer_engine|MS-AMP|flash", template):
        return "not ours"  # a missing optional package: the user's choice, not a precision fault
    if INDEX_DTYPE.search(template):
        return "not ours"
    if library in ATTENTION_LIBS and REFUSAL.search(template):
        return "flash-attention-unsupported"
    for cat, rx in CLASSES_RE:
        if rx.search(template):
            if cat == "distributed-communication" and ARCH.search(template):
                return "no-kernel-image"  # a communication kernel built for newer GPUs than this one
            if cat == "accelerate-config" and library not in {"accelerate", "transformers", "deepspeed", "lightning", "peft"}:
                continue
            return cat
    if ARCH.search(template):  # a kernel built for other GPUs refusing this one
        if re.search(r"(?i)attention", template):
            return "flash-attention-unsupported"
        return "fp8-unsupported" if re.search(r"(?i)fp8|float8|mxfp|nvfp4|\bfp4\b", template) else "no-kernel-image"
    return "not ours"


# --- sources ----------------------------------------------------------------------------------

def installed(library: str) -> tuple[str, list[tuple[str, str]]]:
    dist, folders = INSTALLED[library]
    version = metadata.version(dist)
    site = Path(metadata.distribution(dist).locate_file(""))
    files: list[tuple[str, str]] = []
    for folder in folders:
        base = site / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(site).as_posix()
            if not SKIP_DIRS.search("/" + rel):
                files.append((rel, "py"))
        if library == "torch":
            for p in sorted((base / "include").rglob("*.h")):
                rel = p.relative_to(site).as_posix()
                if re.search(r"/(ATen|c10|torch/csrc)/", rel):
                    files.append((rel, "h"))
    return version, [(str(site / rel), kind) for rel, kind in files]


# library -> (public repository, version file at HEAD, the regex whose groups joined by "." are the version)
REPOS = {
    "deepspeed": ("deepspeedai/DeepSpeed", "version.txt", r"(\S+)"),
    "bitsandbytes": ("bitsandbytes-foundation/bitsandbytes", "bitsandbytes/__init__.py", r'__version__ = "([^"]+)"'),
    "peft": ("huggingface/peft", "src/peft/__init__.py", r'__version__ = "([^"]+)"'),
    "diffusers": ("huggingface/diffusers", "src/diffusers/__init__.py", r'__version__ = "([^"]+)"'),
    "xformers": ("facebookresearch/xformers", "version.txt", r"(\S+)"),
    "flash-attn": ("Dao-AILab/flash-attention", "flash_attn/__init__.py", r'__version__ = "([^"]+)"'),
    "torchao": ("pytorch/ao", "version.txt", r"(\S+)"),
    "transformer-engine": ("NVIDIA/TransformerEngine", "build_tools/VERSION.txt", r"(\S+)"),
    "comfyui": ("Comfy-Org/ComfyUI", "comfyui_version.py", r'__version__ = "([^"]+)"'),
    "nccl": ("NVIDIA/nccl", "makefiles/version.mk",
             r"NCCL_MAJOR\s*:=\s*(\d+)\s+NCCL_MINOR\s*:=\s*(\d+)\s+NCCL_PATCH\s*:=\s*(\d+)"),
    "rocm-hip": ("ROCm/clr", "", ""),  # no version file: the commit and its date
}
CPP_EXT = (".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp", ".cxx")
REPO_SKIP = re.compile(r"(?:^|/)(?:third_party|3rdparty|cutlass|tests?|testing|benchmarks?|examples?|docs?|"
                       r"samples?|tools?|hipify|_vendor|vendor|opencl|khronos|elf)/")


def from_git(gitdir: str, library: str = "") -> tuple[str, list[tuple[str, str]], callable]:
    def git(*a: str) -> str:
        return subprocess.run(["git", "--git-dir", gitdir, *a], capture_output=True, text=True, check=True,
                              errors="replace").stdout

    version = git("describe", "--tags", "--always").strip()
    if library in REPOS:
        _repo, vfile, rx = REPOS[library]
        try:
            m = re.search(rx, git("show", f"HEAD:{vfile}")) if vfile else None
        except subprocess.CalledProcessError:
            m = None
        date = git("log", "-1", "--format=%cs", "HEAD").strip()
        version = f"{'.'.join(m.groups()) + ' ' if m else ''}(git {version}, {date})"
    files = []
    for n in git("ls-tree", "-r", "--name-only", "HEAD").splitlines():
        if SKIP_DIRS.search("/" + n) or REPO_SKIP.search(n):
            continue
        if n.endswith(".py"):
            files.append((n, "py"))
        elif n.endswith(CPP_EXT):
            files.append((n, "cpp"))

    def read(n: str) -> str:
        try:
            return git("show", f"HEAD:{n}")
        except subprocess.CalledProcessError:
            return ""  # a file the snapshot lists but does not hold (a large one left out)

    return version, files, read


def dump(library: str, version: str, origin: str, entries: list[dict]) -> str:
    def q(s: str) -> str:
        s = s.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group(0)):04x}", s) + '"'

    lines = ["# Mined by scripts/mine_catalogue.py: do not edit by hand (corrections go to review.toml).",
             f'library = {q(library)}', f'version = {q(version)}', f'origin = {q(origin)}', ""]
    for e in entries:
        lines += ["[[message]]", f"template = {q(e['template'])}", f"kind = {q(e['kind'])}",
                  f"source = {q(e['source'])}", f"category = {q(e['category'])}", ""]
    return "\n".join(lines)


def label(library: str, entries: list[dict], review: dict) -> list[dict]:
    seen, out = set(), []
    overrides = review.get(library, {})
    for e in entries:
        key = e["template"]
        if key in seen:
            continue
        seen.add(key)
        e["category"] = overrides.get(key, classify(key, library, e.get("kind", "")))
        out.append(e)
    return out


# --- rules from the catalogue: the libraries' own words for the messages no rule knows ----------

RULE_WORDS = {
    "accelerate-config": ("The training library refused its configuration",
                          "the accelerate / DeepSpeed / FSDP / Trainer configuration contradicts itself or the code",
                          "Read the message: it names the setting that conflicts; set it once (the launch config, "
                          "the DeepSpeed/FSDP file, or the script), not in two places."),
    "bf16-unsupported": ("bf16 is not supported here", "bf16 was asked for where the hardware or build cannot do it",
                         "Use fp16 (with a GradScaler) or fp32 on this GPU, or an Ampere-or-newer GPU "
                         "(compute capability 8.0+)."),
    "cuda-unavailable": ("No usable GPU",
                         "the library found no usable GPU (a CPU-only build, no driver or no visible device)",
                         "Check `nvidia-smi`, `CUDA_VISIBLE_DEVICES` and that torch is a CUDA build "
                         "(`python -c 'import torch; print(torch.version.cuda)'`)."),
    "cuda-library-missing": ("A CUDA library is missing or mismatched", "a CUDA/cuDNN/NCCL library could not be loaded",
                             "Install the CUDA libraries the build expects (the pip wheels of the same CUDA major "
                             "version), or a torch build matching the system's."),
    "device-mismatch": ("Tensors on different devices",
                        "a library found tensors (or a model and its inputs) on different devices",
                        "Move the model and every input to one device (`model.to(device)`, each batch tensor "
                        "`.to(device)`) before the call, or let accelerate place them (`accelerator.prepare`)."),
    "distributed-communication": ("A distributed communication failure", "the process group or a collective failed",
                                  "Look at the first rank that failed; check that every rank reaches the same "
                                  "collectives with the same shapes, and the network interface and timeouts."),
    "driver-too-old": ("The GPU driver is too old", "the library found a driver older than it needs",
                       "Update the NVIDIA driver, or install a build for an older CUDA."),
    "dtype-mismatch": ("Tensors of different dtypes met",
                       "a library found tensors of different floating dtypes in one operation",
                       "Cast to one dtype before the call, or run the op under autocast; a half-precision model "
                       "needs half inputs."),
    "flash-attention-unsupported": ("The fused attention kernel refused",
                                    "FlashAttention / SDPA refused this GPU, dtype, mask or version",
                                    "Use `attn_implementation='sdpa'` or `'eager'`, or meet the kernel's demands "
                                    "(fp16/bf16 inputs, an Ampere-or-newer GPU, the version it names)."),
    "fp16-unsupported-device": ("fp16 is not supported on this device",
                                "fp16 mixed precision was asked for on a device that cannot run it",
                                "Run without fp16 on this device (fp32, or bf16 where supported), or on a CUDA GPU."),
    "fp8-unsupported": ("fp8 cannot run here",
                        "fp8 was asked for without a capable GPU or backend, or with a configuration it refuses",
                        "fp8 needs compute capability 8.9+ and a backend (Transformer Engine, torchao, MS-AMP); "
                        "otherwise train in bf16."),
    "non-finite-values": ("Non-finite values", "a library found NaN or Inf values",
                          "Find the first step that produced them (a learning rate too high, fp16 overflow, a "
                          "division by zero); bf16 or a smaller learning rate often helps."),
    "out-of-memory": ("Out of memory on the device", "the device ran out of memory",
                      "Reduce the batch size or sequence length, enable gradient checkpointing, or free cached models."),
    "version-incompatible": ("Library versions do not fit together",
                             "an installed library is older or newer than the one it works with",
                             "Install the versions the message names."),
}


def _pattern(template: str) -> str | None:
    """The template as a bounded pattern: each literal piece escaped (whitespace as one
    to three spaces), each placeholder as up to 120 characters; None when no piece is
    long enough to be the library's own words."""
    pieces = [p.strip(" `'\"()[]<>.,:;=#") for p in template.replace("**", "{}").split("{}")]
    pieces = [p for p in pieces if re.search(r"\w{3}", p)]
    if not pieces or max(len(p) for p in pieces) < 20:
        return None
    kept, total = [], 0  # the message's first ~150 characters name it; a long line may be cut
    for p in pieces:
        if total + len(p) > 150:
            cut = p[:max(0, 150 - total)].rsplit(" ", 1)[0].strip(" `'\"()[]<>.,:;=#")
            if re.search(r"\w{3}", cut):
                kept.append(cut)
            break
        kept.append(p)
        total += len(p)
    pieces = kept or pieces[:1]
    esc = [re.sub(r"(?:\\ )+", lambda _m: r"\s{1,3}", re.escape(p)) for p in pieces]
    return ".{0,120}?".join(esc)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_rules(catalogue: Path, rules_dir: Path) -> None:
    """Write the catalogue rules, then run their own examples and drop what fails (a
    message another rule of another category owns, a pattern shadowed by an earlier one)
    until every case passes."""
    import importlib

    drop: set[str] = set()
    for _ in range(4):
        written = _write_rules(catalogue, rules_dir, drop)
        for mod in [m for m in sys.modules if m.startswith("mpdoctor")]:
            del sys.modules[mod]
        rulebase = importlib.import_module("mpdoctor.rulebase")
        selftest = importlib.import_module("mpdoctor.engine.selftest")
        rules = rulebase.load(kind="log")
        only = [r for r in rules if r.id.startswith("catalogue-")]
        failed = [r for r in selftest.run_selftest(rules, rulebase.case_runners(), only) if not r.ok]
        # a catalogue rule must never outrank a hand-written rule on that rule's own example
        by_id = {r.id: r for r in rules}
        for f in selftest.run_selftest(rules, rulebase.case_runners(), [r for r in rules if r not in only]):
            if f.ok or f.kind != "example" or "'catalogue-" not in f.message:
                continue
            ex = by_id[f.rule].examples[f.index]
            text = ex.text or ((ROOT / ex.file).read_text(encoding="utf-8", errors="replace") if ex.file else "")
            for pats in written.values():
                drop.update(p for p in pats if re.search(p, text))
            failed.append(f)
        if not failed:
            return
        for f in failed:
            if f.rule not in written:
                continue  # a hand-written rule's example, handled above
            pats = written[f.rule]  # one example per pattern, in the same order
            if f.kind == "example":
                drop.add(pats[f.index])
            elif f.kind == "pattern":
                drop.update(pats[int(n) - 1] for n in re.findall(r"patterns\.(\d+)", f.message))  # from 1
        print(f"dropped {len(drop)} patterns that fail their own example", file=sys.stderr)


def _write_rules(catalogue: Path, rules_dir: Path, drop: set[str]) -> dict[str, list[str]]:
    """rules/log/<category>/catalogue-<category>[-warning].toml for the relevant messages no
    other rule recognises (judged by explain itself), each with its rendered example."""
    sys.path.insert(0, str(ROOT))
    from mpdoctor import rulebase
    from mpdoctor.commands.rules import judge_message, load_catalogue, render_template

    rules = [r for r in rulebase.load() if r.kind == "log" and not r.id.startswith("catalogue-")]
    groups: dict[tuple[str, bool], list[dict]] = {}
    for m in load_catalogue(catalogue):
        if m["category"] not in RULE_WORDS:
            continue
        ok, _ = judge_message(m, rules)
        pat = _pattern(m["template"])
        if ok or pat is None or pat in drop:
            continue
        warn = m["kind"] == "warning" or m["kind"].endswith("Warning")
        groups.setdefault((m["category"], warn), []).append({**m, "pattern": pat})
    for old in rules_dir.glob("*/catalogue-*.toml"):
        old.unlink()
    written: dict[str, list[str]] = {}
    for (cat, warn), ms in sorted(groups.items()):
        title, what, fix = RULE_WORDS[cat]
        rid = f"catalogue-{cat}" + ("-warning" if warn else "")
        seen, pats, exs = set(), [], []
        for m in ms:
            if m["pattern"] in seen:
                continue
            seen.add(m["pattern"])
            pats.append(m["pattern"])
            exs.append((render_template(m["template"], m["kind"]), f"{m['library']} {m['version']} {m['source']}"))
        libs = sorted({f"{m['library']} {m['version']}" for m in ms})
        lines = [
            "# Made by scripts/mine_catalogue.py --rules from catalogue/*.toml: the libraries' own words for",
            "# the relevant messages no hand-written rule recognises. Do not edit; improve a hand-written rule",
            "# (or catalogue/review.toml) and re-run the script.",
            f'id = "{rid}"', f'category = "{cat}"', f'severity = "{"warning" if warn else "error"}"',
            f"title = {_q(title + ' (the library says: {message})')}",
            f"summary = {_q('A library message, mined from its source, saying that ' + what + '.')}",
            f"versions = {_q(', '.join(libs))}",
            "priority = 20", "",
            "patterns = [",
        ]
        lines += ["  '''(?P<message>" + p + ".{0,240})'''," for p in pats]  # the rest of the line too
        lines += [
            "]", "",
            "explanation = [" + _q("The library reported: \"{message}\".") + ", " + _q(
                "This is its own wording, mined from its source (catalogue/): mpdoctor knows the message, "
                "not more about its cause.") + "]",
            "fixes = [" + _q(fix) + "]", "",
            "[doc]",
            "detects = " + _q("The messages of " + ", ".join(sorted({m["library"] for m in ms})) + " that say "
                              + what + ", word for word as their source has them."),
            'why = "Each library words its refusals its own way; the catalogue mined from the sources knows them '
            'all, the hand-written rules only the common ones."',
            'known_problems = "A placeholder of the message matches up to 120 characters of anything; only the '
            'message is read out, no facts."',
            "",
        ]
        for text, src in exs:
            lines += ["[[example]]", "note = " + _q(src), "text = '''", text, "'''", ""]
        lines += ["[[near_miss]]", 'note = "a training progress line: no library message"',
                  "text = '''", "INFO step 120 loss 1.234 lr 2e-5 grad_norm 0.91", "'''", ""]
        (rules_dir / cat).mkdir(exist_ok=True)
        (rules_dir / cat / f"{rid}.toml").write_text("\n".join(lines), encoding="utf-8")
        written[rid] = pats
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", default=[], metavar="NAME=GITDIR",
                    help="also mine a fetched repository's Python files at HEAD")
    ap.add_argument("--only", action="append", default=[], help="only these installed libraries")
    ap.add_argument("--cudart", metavar="LIBCUDART",
                    help="also mine cudaGetErrorString's texts from a libcudart.so (the nvidia-cuda-runtime-cu12 "
                         "wheel's nvidia/cuda_runtime/lib/libcudart.so.12), with --cudart-version")
    ap.add_argument("--cudart-version", default="", help="the wheel's version, recorded with its messages")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--relabel", action="store_true",
                    help="only label the catalogue's messages again (classify() and review.toml), mining nothing")
    ap.add_argument("--rules", action="store_true",
                    help="write rules/log/<category>/catalogue-*.toml from the catalogue, mining nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.rules:
        write_rules(out, ROOT / "rules" / "log")
        return 0
    out.mkdir(exist_ok=True)
    review_path = out / "review.toml"
    review = tomllib.loads(review_path.read_text(encoding="utf-8")) if review_path.exists() else {}
    if args.relabel:
        for p in sorted(out.glob("*.toml")):
            if p.name == "review.toml":
                continue
            data = tomllib.loads(p.read_text(encoding="utf-8"))
            entries = label(data["library"], [{k: m[k] for k in ("template", "kind", "source")}
                                              for m in data["message"]], review)
            p.write_text(dump(data["library"], data["version"], data["origin"], entries), encoding="utf-8")
        return 0
    for library in args.only or list(INSTALLED):
        version, files = installed(library)
        site = str(Path(metadata.distribution(INSTALLED[library][0]).locate_file(""))) + "/"
        entries: list[dict] = []
        for path, kind in files:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            rel = path.removeprefix(site)
            entries += mine_python(text, rel) if kind == "py" else mine_cpp(text, rel)
        entries = label(library, entries, review)
        (out / f"{library}.toml").write_text(dump(library, version, "installed wheel", entries), encoding="utf-8")
        print(f"{library} {version}: {len(entries)} messages, "
              f"{sum(e['category'] != 'not ours' for e in entries)} relevant", file=sys.stderr)
    if args.cudart:
        entries = label("cuda-runtime", mine_cudart(args.cudart), review)
        (out / "cuda-runtime.toml").write_text(
            dump("cuda-runtime", args.cudart_version or "unknown",
                 "libcudart.so from the nvidia-cuda-runtime-cu12 wheel (its cudaGetErrorString table), "
                 "as torch prints it: 'CUDA error: <text>'", entries), encoding="utf-8")
        print(f"cuda-runtime: {len(entries)} messages, "
              f"{sum(e['category'] != 'not ours' for e in entries)} relevant", file=sys.stderr)
    for spec in args.repo:
        library, _, gitdir = spec.partition("=")
        version, files, read = from_git(gitdir, library)
        entries = []
        for name, kind in files:
            text = read(name)
            if kind == "py":
                entries += mine_python(text, name)
            else:
                entries += mine_cpp(text, name, library)
                if library in TABLE_FORM and "ErrorString" in text:
                    entries += mine_table(text, name, library)
        entries = label(library, entries, review)
        (out / f"{library}.toml").write_text(dump(library, version, "public repository at HEAD (git describe)", entries),
                                             encoding="utf-8")
        print(f"{library} {version}: {len(entries)} messages, "
              f"{sum(e['category'] != 'not ours' for e in entries)} relevant", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
