"""Versions as messages spell them: package requirements, CUDA numbers, shared
libraries and C++ symbols, turned into facts an explanation can state plainly.

- `versions`: `required` (">=0.20.1" or "accelerate>=0.20.1") against `found`;
  `torch_version` ("2.1.2+cu121") -> `torch_cuda` ("12.1") or a CPU-only build;
  `built_cuda_number` ("1201") -> `built_cuda`; `attr` of `module` -> the torch
  release that introduced it; two CUDA versions -> whether their majors differ.
- `cuda_library`: `lib` ("libcudart.so.12") -> what the library is, the CUDA major it
  belongs to and the pip wheel that ships it; `symbol` -> the demangled C++ name and
  whether it belongs to PyTorch (an extension built for another torch) or to a CUDA
  library (a CUDA component of another release on the library path).

Pure functions, never raising; versions are read and compared by mpdoctor/knowledge/versions.py.
"""

from __future__ import annotations

import re
from typing import Any

from ...knowledge.versions import (
    compare,
    cuda_int_to_str,
    cudnn_version,
    is_prerelease,
    major,
    parse_message_requirement,
    release,
)
from . import deriver


def torch_build(text: str | None) -> dict[str, str]:
    """'2.1.2+cu121' -> torch_cuda '12.1'; '2.1.2+cpu' -> a CPU-only build."""
    out: dict[str, str] = {}
    if not text:
        return out
    m = re.search(r"\+cu(\d{2,3})\b", str(text))
    if m:
        out["torch_cuda"] = cuda_int_to_str(m.group(1))
    elif re.search(r"\+cpu\b", str(text)):
        out["torch_cpu_only"] = "a CPU-only build"
    elif m2 := re.search(r"\+rocm([\d.]+)", str(text)):
        out["torch_rocm"] = m2.group(1)
    return out


# When a torch attribute or module first appeared (release notes; see
# ../shared/reference/compat-facts.md for the amp ones). Only attributes whose first
# release is certain are listed: a wrong "added in" is worse than none.
TORCH_ATTR_SINCE: dict[str, str] = {
    "compile": "2.0",
    "scaled_dot_product_attention": "2.0",  # torch.nn.functional
    "float8_e4m3fn": "2.1",
    "float8_e5m2": "2.1",
    "compiler": "2.1",
    "float8_e4m3fnuz": "2.2",
    "float8_e5m2fnuz": "2.2",
    "register_pytree_node": "2.2",
    "GradScaler": "2.3",  # torch.amp.GradScaler (device-agnostic)
    "uint16": "2.3",
    "uint32": "2.3",
    "uint64": "2.3",
    "register_fake": "2.4",
    "RMSNorm": "2.4",  # torch.nn
    "custom_op": "2.4",
    "is_autocast_available": "2.4",
}


_PIP_NAMES = {"pytorch": "torch", "flash_attn": "flash-attn", "huggingface_hub": "huggingface-hub",
              "pytorch_lightning": "pytorch-lightning", "auto_gptq": "auto-gptq"}
_IMPORT_NAMES = {"huggingface-hub": "huggingface_hub", "flash-attn": "flash_attn",
                 "pytorch-lightning": "pytorch_lightning", "auto-gptq": "auto_gptq", "lightning": "lightning"}


# torch submodules whose appearance/removal is certain.
TORCH_MODULE_CHANGES: dict[str, tuple[str, str]] = {
    "torch._six": ("removed", "2.0"),
    "torch._dynamo": ("added", "2.0"),
    "torch.compiler": ("added", "2.1"),
}


@deriver("versions", facts=("built_cuda", "comparison", "cuda_major_differs", "cudnn_compiled_version", "cudnn_runtime_is", "cudnn_runtime_version", "import_name", "introduced_in", "major_mismatch", "minor_mismatch", "missing_api", "module_change", "module_removed", "pip_name", "prerelease_note", "required_op", "required_version", "torch_cpu_only", "torch_cuda"))
def versions(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pkg_fact = facts.get("package")
    req = parse_message_requirement(facts.get("required"))
    if req is not None:
        pkg, op, ver = req
        if pkg and "package" not in facts:
            out["package"] = pkg.split("[")[0]
        out["required_op"] = op
        out["required_version"] = ver
        found = facts.get("found")
        if found:
            c = compare(found, ver)
            if c is not None:
                if op in (">=", ">") and c < 0 or op == ">" and c == 0:
                    out["comparison"] = "older than"
                elif op in ("<=", "<") and c > 0 or op == "<" and c == 0:
                    out["comparison"] = "newer than"
                elif op == "==" and c != 0:
                    out["comparison"] = "different from"
            rel = release(found)
            if c == -1 and is_prerelease(found) and rel and compare(".".join(map(str, rel)), ver) == 0:
                out["prerelease_note"] = (
                    f"{found} is a pre-release build; version checks treat it as older than {ver}"
                )
    pkg = pkg_fact or out.get("package")
    if pkg:
        # What pip and Python call it ("PyTorch" is the `torch` distribution; the PyPI
        # package named "pytorch" is a placeholder that must never be installed).
        pip_name = _PIP_NAMES.get(str(pkg).lower(), str(pkg).lower())
        out["pip_name"] = pip_name
        out["import_name"] = _IMPORT_NAMES.get(pip_name, pip_name.replace("-", "_"))
    for key in ("torch_version", "found_torch", "you_have"):
        if facts.get(key):
            for k, v in torch_build(facts[key]).items():
                out.setdefault(k, v)
    for key, target in (("built_cuda_number", "built_cuda"), ("cuda_number", "cuda")):
        v = cuda_int_to_str(facts.get(key))
        if v:
            out[target] = v
    cc, cr = cudnn_version(facts.get("cudnn_compiled")), cudnn_version(facts.get("cudnn_runtime"))
    if cc:
        out["cudnn_compiled_version"] = cc
    if cr:
        out["cudnn_runtime_version"] = cr
    if cc and cr:
        out["cudnn_runtime_is"] = "older" if compare(cr, cc) == -1 else "newer" if compare(cr, cc) == 1 else "the same"
    mod = facts.get("torch_module")
    if mod:
        out["missing_api"] = str(mod)
        change = TORCH_MODULE_CHANGES.get(str(mod))
        if change and change[0] == "removed":
            out["module_removed"] = str(mod)
            out["module_change"] = f"was removed in torch {change[1]}"
        elif change:
            out["introduced_in"] = change[1]
            out["module_change"] = f"first appeared in torch {change[1]}"
    attr = facts.get("attr")
    if attr:
        out["missing_api"] = f"{facts.get('module', 'torch')}.{attr}"
    if attr and str(facts.get("module", "torch")).split(".")[0] == "torch":
        since = TORCH_ATTR_SINCE.get(str(attr))
        if since:
            out["introduced_in"] = since
    if facts.get("xformers_failed"):
        # the warning's consequence is in the log: it is the cause of an error now
        out["severity"] = "error"
    a, b = facts.get("cuda_a"), facts.get("cuda_b")
    ma, mb = major(a), major(b)
    if ma is not None and mb is not None:
        out["cuda_major_differs"] = "yes" if ma != mb else "no"
        if ma != mb:
            out["major_mismatch"] = f"CUDA {ma} vs CUDA {mb}"
        elif a != b:
            out["minor_mismatch"] = f"{a} vs {b}"
    return out


# --- shared libraries and symbols ---------------------------------------------------

# Library stem -> (what it is, pip wheel stem, whether its soversion is the CUDA major).
_LIBS: dict[str, tuple[str, str | None, bool]] = {
    "libcudart": ("the CUDA runtime", "nvidia-cuda-runtime", True),
    "cudart64": ("the CUDA runtime", "nvidia-cuda-runtime", True),
    "libcublas": ("cuBLAS", "nvidia-cublas", True),
    "libcublasLt": ("cuBLASLt", "nvidia-cublas", True),
    "cublas64": ("cuBLAS", "nvidia-cublas", True),
    "cublasLt64": ("cuBLASLt", "nvidia-cublas", True),
    "libnvrtc": ("NVRTC (runtime compilation)", "nvidia-cuda-nvrtc", True),
    "libnvrtc-builtins": ("NVRTC's builtins library", "nvidia-cuda-nvrtc", True),
    "libnvJitLink": ("nvJitLink", "nvidia-nvjitlink", True),
    "libcusparse": ("cuSPARSE", "nvidia-cusparse", False),
    "libcufft": ("cuFFT", "nvidia-cufft", False),
    "libcurand": ("cuRAND", "nvidia-curand", False),
    "libcusolver": ("cuSOLVER", "nvidia-cusolver", False),
    "libcupti": ("CUPTI", "nvidia-cuda-cupti", True),
    "libnvToolsExt": ("NVTX", "nvidia-nvtx", False),
    "libnccl": ("NCCL", "nvidia-nccl", False),
    "libcudnn": ("cuDNN", "nvidia-cudnn", False),
    "cudnn64": ("cuDNN", "nvidia-cudnn", False),
    "libcusparseLt": ("cuSPARSELt", "nvidia-cusparselt", False),
    "libcufile": ("cuFile (GPUDirect Storage)", "nvidia-cufile", False),
    "libnvshmem_host": ("NVSHMEM", "nvidia-nvshmem", False),
}
_LIB_NAME = re.compile(
    r"(?P<stem>(?:lib)?[A-Za-z][A-Za-z0-9\-]*?)(?:_(?P<part>[a-z_]+?))?(?:\.so(?:\.(?P<sover>\d+(?:\.\d+){0,2}))?|(?P<win>\d+)?(?:_(?P<winver>\d+))?\.dll)$"
)


def library_info(name: str | None) -> dict[str, str]:
    """'libcudart.so.12' -> library libcudart, soversion 12, component 'the CUDA runtime',
    cuda_major 12, pip_package nvidia-cuda-runtime-cu12. Unknown libraries give only
    their name and soversion."""
    out: dict[str, str] = {}
    if not name:
        return out
    base = str(name).strip().strip("'\"`").replace("\\", "/").rsplit("/", 1)[-1]
    m = _LIB_NAME.match(base)
    if not m:
        return out
    stem = m.group("stem")
    part = m.group("part")
    if m.group("win") and f"{stem}{m.group('win')}" in _LIBS:  # cublas64_12.dll
        stem = f"{stem}{m.group('win')}"
    sover = m.group("sover") or m.group("winver")
    if stem.startswith("libcudnn") or stem.startswith("cudnn"):
        key = "libcudnn"
    else:
        key = stem if stem in _LIBS else (f"{stem}_{part}" if part and f"{stem}_{part}" in _LIBS else stem)
    out["library"] = base
    if sover:
        out["soversion"] = sover
    info = _LIBS.get(key) or _LIBS.get(stem)
    if not info:
        return out
    what, wheel, sover_is_cuda = info
    out["component"] = what
    major = (sover or "").split(".")[0]
    if key == "libcudnn" and major:
        out["cudnn_major"] = major
        out["component"] = f"cuDNN {major}"
    if sover_is_cuda and major:
        out["cuda_major"] = major
        if wheel and major in ("11", "12", "13"):  # the only CUDA majors with pip wheels
            out["pip_package"] = f"{wheel}-cu{major}"
    elif wheel:
        # the soversion does not say the CUDA major: name the current one, and the other
        out["pip_package"] = f"{wheel}-cu12"
        out["pip_alt"] = f"{wheel}-cu11"
    return out


def demangle(symbol: str | None) -> str | None:
    """A minimal Itanium demangler for the nested name of a symbol:
    '_ZN3c104cuda9SetDeviceEi' -> 'c10::cuda::SetDevice';
    '_ZN3c105ErrorC2ENS_...' -> 'c10::Error::Error'. None when it is not mangled."""
    if not symbol:
        return None
    s = str(symbol)
    m = re.match(r"_ZN(?:K|V|r)*", s)
    if not m:
        return None
    i = m.end()
    parts: list[str] = []
    while i < len(s):
        if s[i].isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            n = int(s[i:j])
            parts.append(s[j:j + n])
            i = j + n
        elif s.startswith(("C1", "C2", "C3", "D0", "D1", "D2"), i) and parts:
            parts.append(("~" if s[i] == "D" else "") + parts[-1])
            i += 2
        elif s.startswith("St", i):
            parts.append("std")
            i += 2
        else:
            break
    return "::".join(parts) if parts else None


_TORCH_NAMESPACES = ("c10", "at", "torch", "caffe2", "pybind11")


@deriver("cuda_library", facts=("component", "cuda_major", "cudnn_major", "cxx11_abi", "dep_component", "dep_library", "dep_pip_alt", "dep_pip_package", "dep_soversion", "driver_lib_missing", "flash_attn_wheel", "library", "missing_dep", "needs_nvjitlink", "pip_alt", "pip_package", "soversion", "symbol_name", "symbol_owner", "system_cuda"))
def cuda_library(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in library_info(facts.get("lib")).items():
        out[k] = v
    sym = facts.get("symbol")
    if sym:
        name = demangle(sym)
        if name:
            out["symbol_name"] = name
            ns = name.split("::")[0]
            if ns in _TORCH_NAMESPACES:
                out["symbol_owner"] = "PyTorch"
        if "__cxx11" in str(sym):
            out["cxx11_abi"] = "__cxx11"
        jit = re.match(r"__?nvJitLink\w*?_(\d+)_(\d+)$", str(sym))
        if jit:
            out["needs_nvjitlink"] = f"{jit.group(1)}.{jit.group(2)}"
        if str(sym).startswith(("cuda", "cublas", "cudnn", "nccl", "cusparse", "__nvJitLink", "nvJitLink")):
            out["symbol_owner"] = "a CUDA library"
    ext = str(facts.get("extension") or "")
    if ext.startswith("flash_attn"):
        out["flash_attn_wheel"] = "flash-attn"
    path = str(facts.get("lib_path") or facts.get("ld_cuda") or "")
    m = re.search(r"cuda-(\d+\.\d+)", path)
    if m:
        out["system_cuda"] = m.group(1)
    if "site-packages/nvidia/" in path.replace("\\", "/") or "dist-packages/nvidia/" in path.replace("\\", "/"):
        out["from_pip_wheel"] = "yes"
    # A dependency that failed to open (read as `_missing_dep`): only worth naming when it
    # is not the library itself ("Could not load library X. Error: X: cannot open ...").
    dep = str(facts.get("_missing_dep") or facts.get("missing_dep") or "").strip()
    if dep and dep != out.get("library", str(facts.get("lib") or "")):
        out["missing_dep"] = dep
        if dep.startswith("libcuda.so"):
            out["driver_lib_missing"] = dep
        out.update({f"dep_{k}": v for k, v in library_info(dep).items()})
    return out


# --- keyword arguments accelerate's Accelerator dropped or gained ---------------------------
# Checked against accelerate's source: `logging_dir` warned "deprecated and will be removed in
# version 0.18.0 ... Use `project_dir` instead"; 0.28 warned "Passing the following arguments to
# `Accelerator` is deprecated and will be removed in version 1.0 of Accelerate:
# dict_keys(['dispatch_batches', 'split_batches', 'even_batches', 'use_seedable_sampler']).
# Please pass an `accelerate.DataLoaderConfiguration` instead" (1.x still accepts
# split_batches); `fp16=True` was the spelling before `mixed_precision`.
_ACCELERATE_REMOVED = {
    "dispatch_batches": ("1.0", "`dataloader_config=DataLoaderConfiguration(dispatch_batches=...)` (from accelerate import DataLoaderConfiguration)"),
    "even_batches": ("1.0", "`dataloader_config=DataLoaderConfiguration(even_batches=...)`"),
    "use_seedable_sampler": ("1.0", "`dataloader_config=DataLoaderConfiguration(use_seedable_sampler=...)`"),
    "logging_dir": ("0.18", "`project_dir=...` (or `project_config=ProjectConfiguration(project_dir=..., logging_dir=...)`)"),
    "fp16": (None, "`mixed_precision=\"fp16\"`"),
    "use_fp16": (None, "`mixed_precision=\"fp16\"`"),
}
_ACCELERATE_ADDED = {
    "dataloader_config": "0.28",
    "project_config": None,
    "project_dir": None,
    "parallelism_config": None,
}


@deriver("accelerate_kwarg", facts=("_code_newer", "_code_older", "accelerate_change", "kwarg", "replacement", "via_trainer"))
def accelerate_kwarg(facts: dict[str, Any], hits: list[dict[str, Any]]) -> dict[str, Any]:
    """`Accelerator.__init__() got an unexpected keyword argument 'X'`: was X removed (old
    code on a new accelerate) or is it newer than the installed accelerate?"""
    out: dict[str, Any] = {}
    raw = str(facts.get("kwarg_raw") or facts.get("kwarg") or "").strip()
    kw = re.sub(r"[\s_]+", "_", raw)  # 'dispatch batches' from a paste that lost its underscores
    if not kw:
        return out
    out["kwarg"] = kw
    if kw in _ACCELERATE_REMOVED:
        removed_in, replacement = _ACCELERATE_REMOVED[kw]
        out["_code_older"] = "1"
        out["replacement"] = replacement
        out["accelerate_change"] = (f"was deprecated and removed in accelerate {removed_in}" if removed_in
                                    else "is the spelling of old accelerate releases")
    elif kw in _ACCELERATE_ADDED:
        out["_code_newer"] = "1"
        added = _ACCELERATE_ADDED[kw]
        out["accelerate_change"] = (f"was added in accelerate {added}" if added
                                    else "belongs to a newer accelerate than the installed one")
    if facts.get("trainer_frame"):
        out["via_trainer"] = "transformers' Trainer (`create_accelerator_and_postprocess`)"
    return out
