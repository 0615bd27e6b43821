"""Facts that make a fix fit the case: the device type the run used, the spelling the
installed transformers wants, and where an out-of-memory allocated.

Each is a code or a flag, never words: the rules say them through `[words.FACT]` tables
and `{flag:.0}` sentences. Read from the facts a rule already has:

- the device: what a run recorded around the exception (`param_dtypes` "2× float16@cpu",
  `input_dtypes` "float32 cpu (8, 16)", `memory_context` "device cuda:0: ..."), the
  device the run trained on (`_run_device`, diagnosis/run.py's case facts), or the
  log's own words, read by context patterns the rules share word for word: a device said
  (`_dev_said`: "device: cpu", `device='cuda:0'`), this process having no GPU
  (`_dev_no_gpu`: torch's "CUDA is not available", Lightning's "GPU available: False",
  a CPU kernel's name);
- transformers: the version a run had installed (`_run_transformers`) or the log names (`_tf_version`)
  or its own deprecation warning for `torch_dtype` (`_tf_dep`): transformers 4.56
  renamed from_pretrained's `torch_dtype` to `dtype` (huggingface/transformers#39782;
  5.x still accepts `torch_dtype` with "`torch_dtype` is deprecated! Use `dtype`
  instead!"), and 5.x ignores `low_cpu_mem_usage` (loading is always lazy);
- the out-of-memory site: the traceback's frames (context patterns `_oom_attention`,
  `_oom_optimizer`, `_oom_backward`, `_oom_load`) or the module a run saw raise.

Unknown stays unknown: no flag is set, and the rule's words fall back to a spelling that
fits every case (`x.device.type`; `dtype=` with `torch_dtype=` for older versions).
"""

from __future__ import annotations

import re
from typing import Any

from . import deriver

# The facts fit() can add (each deriver that calls it declares them too).
FIT_FACTS = ("_ac_device", "_ac_dev_arg", "_dtype_kw", "_dtype_kw_note", "_low_mem", "_tf5", "_tf_known",
             "_tf_old")
OOM_SITE_FACTS = ("_site_attention", "_site_backward", "_site_load", "_site_not_attention", "_site_optimizer",
                  "oom_site_frame")

_DEVICES = ("cuda", "cpu", "mps", "xpu")
_AT_DEVICE = re.compile(r"@(cuda|cpu|mps|xpu)\b")
_INPUT_DEVICE = re.compile(r"\b(?:float\d{1,2}|bfloat16|int\d{1,2}|bool|float8\w{0,12}) (cuda|cpu|mps|xpu)\b")
_MEMORY_DEVICE = re.compile(r"\bdevice (cuda|mps|xpu)\b")
_VERSION = re.compile(r"(\d{1,3})\.(\d{1,4})")
_ATTENTION_MODULE = re.compile(r"attn|attention", re.IGNORECASE)


def run_device(facts: dict[str, Any]) -> str | None:
    """The device type a run recorded around the exception, if it did."""
    for key, rx in (("param_dtypes", _AT_DEVICE), ("input_dtypes", _INPUT_DEVICE),
                    ("memory_context", _MEMORY_DEVICE)):
        m = rx.search(str(facts.get(key) or ""))
        if m:
            return m.group(1)
    return None


def device_type(facts: dict[str, Any]) -> str | None:
    """The device type this case ran on: the run's record first, then the log's words
    (a device said as MPS, then no GPU at all, then any device said)."""
    d = run_device(facts) or str(facts.get("_run_device") or "").lower() or None
    if d in _DEVICES:
        return d
    said = str(facts.get("_dev_said") or "").lower()
    if said == "mps":
        return "mps"
    if facts.get("_dev_no_gpu"):
        return "cpu"
    return said if said in _DEVICES else None


def transformers_version(facts: dict[str, Any]) -> tuple[int, int] | None:
    for key in ("_run_transformers", "_tf_version"):
        m = _VERSION.search(str(facts.get(key) or ""))
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def fit(facts: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    """The codes and flags above (`_ac_dev_arg`, `_dtype_kw`, `_dtype_kw_note`, `_low_mem`
    are always set: codes whose words the rule picks by the flags that are known).
    `device`: the device the deriver itself read from the message (a CPU kernel's name)."""
    out: dict[str, Any] = {"_ac_dev_arg": "dev", "_dtype_kw": "kw", "_dtype_kw_note": "note", "_low_mem": "lm"}
    d = run_device(facts) or (device if device in _DEVICES else None) or device_type(facts)
    if d:
        out["_ac_device"] = d
    v = transformers_version(facts)
    if v is not None:
        out["_tf_known"] = "yes"
        if v < (4, 56):
            out["_tf_old"] = "yes"
        if v >= (5, 0):
            out["_tf5"] = "yes"
    elif facts.get("_tf_dep"):  # the warning itself: 4.56 or newer
        out["_tf_known"] = "yes"
    return out


def oom_site(facts: dict[str, Any]) -> dict[str, Any]:
    """Where an out-of-memory allocated: attention (a seq x seq score buffer), the
    optimizer's state, the backward pass, loading or moving the weights. Attention first
    (with gradient checkpointing a backward recomputes it), the load last.
    `_site_not_attention` is a code, always set: a rule's [words] say whether advice
    for any other site (loading, offload) fits."""
    site = _site(facts)
    site["_site_not_attention"] = "other"
    return site


def _site(facts: dict[str, Any]) -> dict[str, Any]:
    module = " ".join(str(facts.get(k) or "") for k in ("module", "module_type"))
    for key, flag in (("_oom_attention", "_site_attention"), ("_oom_optimizer", "_site_optimizer"),
                      ("_oom_backward", "_site_backward"), ("_oom_load", "_site_load")):
        if key == "_oom_attention" and not facts.get(key) and _ATTENTION_MODULE.search(module):
            return {flag: "yes", "oom_site_frame": str(facts.get("module") or facts.get("module_type"))}
        if facts.get(key):
            return {flag: "yes", "oom_site_frame": _frame(str(facts[key]))}
    return {}


_FRAME = re.compile(r'^[/\\]?(?P<file>[^"]{1,200})", line (?P<line>\d{1,6}), in (?P<func>\w{1,80})$')


def _frame(text: str) -> str:
    """A frame as read ('/torch/optim/adamw.py", line 161, in _init_group', 'in _apply',
    'attn_weights = torch.matmul(') said short: 'torch/optim/adamw.py:161 in _init_group',
    '_apply', 'attn_weights = torch.matmul'."""
    text = text.strip()
    m = _FRAME.match(text)
    if m:
        return f"{m.group('file').replace(chr(92), '/')}:{m.group('line')} in {m.group('func')}"
    if text.startswith("in "):
        text = text[3:]
    return text.rstrip("(").strip()


@deriver("fit", facts=FIT_FACTS)
def fit_case(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    return fit(facts)


def machine_facts(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a machine's environment snapshot (`mpdoctor check`'s, the one `explain --here`
    collects) tells the fit facts: its device type (a CUDA GPU, else MPS, else the CPU) and
    its transformers, as the `_run_device` / `_run_transformers` a run hands over. A face
    that re-renders a log finding for this machine (diagnosis/sharpen.py) merges them into
    the finding's facts and computes `fit` again: the rules' [words] then pick
    `torch.autocast("cpu", ...)` and `dtype=` / `torch_dtype=` for this machine."""
    torch_env = snapshot.get("torch") or {}
    if torch_env.get("cuda_available"):
        device = "cuda"
    elif (torch_env.get("mps") or {}).get("available"):
        device = "mps"
    elif torch_env.get("cuda_available") is False:
        device = "cpu"
    else:
        device = None
    versions = (snapshot.get("packages") or {}).get("versions") or {}
    return {k: v for k, v in (("_run_device", device), ("_run_transformers", versions.get("transformers"))) if v}
