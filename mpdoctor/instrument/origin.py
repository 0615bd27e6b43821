"""Where the odd tensor of a failure came from: read once, when an exception passes a
module's forward or leaves the program, never on the hot path.

A dtype or device mismatch names the op that refused ("mat1 and mat2 must have the same
dtype"); the user needs the tensor that was odd and what made it. Here, from the objects
still alive at the failure:

- the candidates: the failing module's own parameters and buffers and its inputs, or,
  outside any module, the tensors named on the failing line of the user's code (then the
  tensors of that frame);
- the odd one: on another device than the rest (``meta`` first), or float64, or a 16-bit
  dtype that is neither float32 nor autocast's, or the minority dtype;
- its origin, first that answers: a parameter or buffer of a named module (an id map
  built now, over the watched model and the modules the user's frames hold); the output
  of a module the forward hooks saw change the dtype (``hooks`` keeps a small weak map of
  those); a custom autograd Function's forward (its ``grad_fn``); a cast or a creation in
  the user's code (the line that assigned the variable holding it, read from the source).

The result is plain data (``RaisedError.context["origin"]``): codes and names, no words.
Everything fails open: an error here gives no origin, never a broken training.
"""

from __future__ import annotations

import linecache
import re
from typing import Any

import torch
from torch import Tensor

from ..knowledge.dtypes import dtype_name
from .origin_source import (
    assigned_at,
    called_module,
    code_kind,
    failure_frames,
    file_line,
    held_in,
    line_of,
    source_of,
    user_file,
)

_MAX_CANDIDATES = 16
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Candidate:
    __slots__ = ("t", "role", "name", "index")

    def __init__(self, t: Tensor, role: str, name: str, index: int = -1) -> None:
        self.t, self.role, self.name, self.index = t, role, name, index


def _autocast_state() -> dict[str, Any]:
    out = {}
    for dev in ("cpu", "cuda", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(dev):
                out[dev] = torch.get_autocast_dtype(dev)
        except Exception:
            continue
    return out


def _autocast_dtypes() -> set[Any]:
    return set(_autocast_state().values())


def _run_autocast(recorder: Any) -> dict[str, Any]:
    """Autocast at the failure: on now, or (a hook that runs after a wrapper such as
    accelerate's left its autocast region) as the precision plan saw the first matmul."""
    live = _autocast_state()
    if live:
        return live
    plan = getattr(getattr(recorder, "plan_tracker", None), "plan", None)
    dt = getattr(torch, str(getattr(plan, "autocast_dtype", "") or ""), None)
    if plan is not None and plan.autocast_enabled and isinstance(dt, torch.dtype):
        return {str(plan.device or "cpu").split(":")[0]: dt}
    return {}


def pick_odd(cands: list[Candidate], autocast: set[Any] | None = None) -> tuple[Candidate, str, str] | None:
    """(the odd candidate, what differs: "device" | "dtype", the others' dtype or device).
    `autocast`: the autocast dtypes of the failing code (the live state when None)."""
    floats = [c for c in cands if c.t.is_floating_point()]
    devices = {c.t.device.type for c in cands}
    if len(devices) > 1:
        counts = {d: sum(c.t.device.type == d for c in cands) for d in devices}
        odd_dev = "meta" if "meta" in devices else min(devices, key=lambda d: (counts[d], d == "cpu"))
        odd = next(c for c in cands if c.t.device.type == odd_dev)
        other = next(c for c in cands if c.t.device.type != odd_dev)
        return odd, "device", str(other.t.device)
    if len(floats) < 2 or len({c.t.dtype for c in floats}) < 2:
        return None
    if autocast is None:
        autocast = _autocast_dtypes()

    def score(c: Candidate) -> int:
        dt = c.t.dtype
        if dt is torch.float64:
            return 3
        if autocast and dt not in autocast and dt is not torch.float32:
            return 2  # float16 weights in a bf16 autocast run
        n = sum(x.t.dtype is dt for x in floats)
        if n < len(floats) - n:
            return 1
        # float32 beside autocast's dtype: it escaped autocast (a custom Function, an op autocast leaves alone)
        return 1 if autocast and dt is torch.float32 and any(x.t.dtype in autocast for x in floats) else 0

    ranked = sorted(floats, key=lambda c: (-score(c), c.role != "input"))
    odd = ranked[0]
    others = [c.t.dtype for c in floats if c.t.dtype is not odd.t.dtype]
    against = max(set(others), key=others.count)
    return odd, "dtype", dtype_name(against)


# ---- what made it ----------------------------------------------------------------------
def _modules_in(frames: list[Any], root: Any, name_of: Any) -> list[tuple[str, Any]]:
    """(prefix, module) to name parameters by: the watched model (as the watcher names
    it) and the modules bound to a name in the user's frames (a frozen teacher)."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    if root is not None:
        out.append(("", root))
        seen.add(id(root))
    for f in reversed(frames):
        if not user_file(f.f_code.co_filename):
            continue
        scopes = [f.f_locals] + ([f.f_globals] if f.f_globals is not f.f_locals else [])
        for scope in scopes:
            for var, obj in list(scope.items())[:400]:
                if isinstance(obj, torch.nn.Module) and var != "self" and not var.startswith("_") and \
                        (id(obj) not in seen or obj is root):
                    seen.add(id(obj))
                    out.append((var, obj))
    return out


def _owner(t: Tensor, modules: list[tuple[str, Any]], name_of: Any) -> tuple[str, str, Any, str] | None:
    """(qualified name, "parameter" | "buffer", owning module, owner name) of `t`."""
    for prefix, root in modules:
        for mname, m in root.named_modules():
            for kind, items in (("parameter", m._parameters), ("buffer", m._buffers)):
                for pname, p in items.items():
                    if p is t:
                        if prefix == "":
                            owner = mname or _user_name(m, modules[1:], name_of)
                        else:
                            owner = ".".join(x for x in (prefix, mname) if x)
                        return (f"{owner}.{pname}" if owner else pname), kind, m, owner
    return None


def _user_name(m: Any, modules: list[tuple[str, Any]], name_of: Any) -> str:
    """A module as the user names it: its name in the watched model, else the variable
    that holds it in the user's code, else its class."""
    name = name_of(m)
    if name and name != type(m).__name__:
        return name
    return next((p for p, x in modules if x is m and p), "") or type(m).__name__


def _param_counts(m: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in m.parameters():
        key = dtype_name(p.dtype)
        out[key] = out.get(key, 0) + 1
    return out


def _trained_ids(frames: list[Any], recorder: Any) -> tuple[set[int], set[int], bool]:
    """The ids of the parameters optimizers hold, of the modules accelerate prepared, and
    whether any optimizer was found at all."""
    opts: list[Any] = []
    tracker = getattr(recorder, "plan_tracker", None)
    for ref in getattr(tracker, "_optimizers", []):
        o = ref()
        if o is not None:
            opts.append(o)
    prepared: set[int] = set()
    for ref in getattr(tracker, "_prepared", []):
        m = ref()
        if m is not None:
            prepared.update(id(x) for x in m.modules())
    for acc in getattr(tracker, "accelerators", []):
        opts.extend(getattr(acc, "_optimizers", []) or [])
        for m in getattr(acc, "_models", []) or []:
            prepared.update(id(x) for x in m.modules())
    for f in frames:
        if user_file(f.f_code.co_filename):
            opts.extend(o for o in list(f.f_globals.values())[:400] + list(f.f_locals.values())[:400]
                        if isinstance(o, torch.optim.Optimizer) or hasattr(o, "param_groups"))
    ids: set[int] = set()
    for o in opts:
        o = getattr(o, "optimizer", o)
        for g in getattr(o, "param_groups", []) or []:
            ids.update(id(p) for p in g.get("params", []))
    return ids, prepared, bool(opts)


def describe(odd: Candidate, frames: list[Any], exc: BaseException | None, recorder: Any) -> dict[str, Any]:
    """The origin record of the odd candidate (codes and names, no words)."""
    t = odd.t
    name_of = recorder.name_of
    rec: dict[str, Any] = {"tensor": odd.name, "role": odd.role, "dtype": dtype_name(t.dtype),
                           "device": str(t.device), "shape": list(t.shape)[:6]}
    if odd.index >= 0:
        rec["input_index"] = odd.index
    modules = _modules_in(frames, getattr(recorder, "_primary", None), name_of)
    owner = _owner(t, modules, name_of)
    opt_ids, prepared, any_opt = _trained_ids(frames, recorder)
    root = getattr(recorder, "_primary", None)
    if owner is not None:
        qual, kind, m, owner_name = owner
        rec.update(kind=kind, tensor=qual, module=owner_name or type(m).__name__, module_type=type(m).__name__)
        rec["module_params"] = _param_counts(m)
        if root is not None and any(x is m for x in root.modules()):
            rec["model_params"] = _param_counts(root)
        if kind == "parameter":
            rec["trainable"] = bool(t.requires_grad)
            if any_opt:
                rec["in_optimizer"] = id(t) in opt_ids
        if prepared or getattr(recorder, "plan_tracker", None) is not None and recorder.plan_tracker.accelerators:
            rec["prepared"] = id(m) in prepared
        if kind == "buffer":
            rec["persistent"] = _buffer_persistent(m, qual.rsplit(".", 1)[-1])
        return rec
    made = getattr(recorder, "_made", {}).get(id(t))
    if made is not None and made[0]() is t and made[1] is not None:
        m = made[1]
        mname = _user_name(m, modules, name_of)
        rec.update(kind="module-output", module=mname, module_type=type(m).__name__, module_params=_param_counts(m))
        if made[2] is not None:
            rec["module_in_dtype"] = dtype_name(made[2])
        if any_opt:
            rec["in_optimizer"] = any(id(p) in opt_ids for p in m.parameters())
        if prepared or recorder.plan_tracker.accelerators:
            rec["prepared"] = id(m) in prepared
    fn = getattr(t, "grad_fn", None)
    fwd = getattr(type(fn), "_forward_cls", None) if fn is not None else None
    if "kind" not in rec and fwd is not None and isinstance(fwd, type) and issubclass(fwd, torch.autograd.Function):
        rec.update(kind="function-output", function=fwd.__name__)
        at = source_of(getattr(fwd, "forward", None))
        if at:
            rec["function_at"] = at
    got = held_in(t, frames, exc)
    if got is not None:
        f, var, before, top = got
        rec["variable"] = var
        where = assigned_at(f, var, before, top)
        if where is not None:
            line, code = where
            rec["at"] = file_line(f.f_code.co_filename, line)
            rec["code"] = code[:160]
            kind, cast, maker = code_kind(code, var)
            if cast:
                rec["cast"] = cast
            if maker:
                rec["maker"] = maker
            if "kind" not in rec:
                called = called_module(code, f)
                if called is not None:  # `t = teacher(x)`: a module the hooks did not watch
                    cname, m = called
                    rec.update(kind="module-output", module=cname, module_type=type(m).__name__,
                               module_params=_param_counts(m))
                    if any_opt:
                        rec["in_optimizer"] = any(id(p) in opt_ids for p in m.parameters())
                    if prepared or recorder.plan_tracker.accelerators:
                        rec["prepared"] = id(m) in prepared
                else:
                    rec["kind"] = kind
    if "kind" not in rec and fn is not None and type(fn).__name__.startswith("ToCopyBackward"):
        rec["kind"] = "cast"
    rec.setdefault("kind", "unknown")
    return rec


def _buffer_persistent(m: Any, name: str) -> bool | None:
    try:
        return name not in m._non_persistent_buffers_set
    except Exception:
        return None


def _tensors_on_line(frame: Any, line_no: int) -> list[Candidate]:
    text = linecache.getline(frame.f_code.co_filename, line_no)
    out: list[Candidate] = []
    seen: set[int] = set()
    for name in dict.fromkeys(_NAME.findall(text)):
        obj = frame.f_locals.get(name, frame.f_globals.get(name))
        if isinstance(obj, Tensor) and id(obj) not in seen:
            seen.add(id(obj))
            out.append(Candidate(obj, "local", name))
    return out


def _frame_tensors(frame: Any) -> list[Candidate]:
    out = []
    for name, obj in list(frame.f_locals.items())[:400]:
        if isinstance(obj, Tensor) and not name.startswith("_"):
            out.append(Candidate(obj, "local", name))
    return out[:_MAX_CANDIDATES]


def origin_in_forward(mod: Any, args: Any, exc: BaseException, recorder: Any) -> dict[str, Any] | None:
    """The odd tensor of a failure inside `mod`'s forward (called from a forward hook):
    among the tensors on the failing line when that forward is the user's own code, else
    among the module's parameters, buffers and inputs."""
    frames = failure_frames(exc, live=True)
    autocast = _run_autocast(recorder)
    amp = set(autocast.values())
    got = None
    line_frame = _user_frame_inside(mod, exc)
    if line_frame is not None:
        got = pick_odd(_tensors_on_line(line_frame, line_of(line_frame, exc)), amp)
    if got is None:
        cands: list[Candidate] = []
        for kind, items in (("parameter", mod._parameters), ("buffer", mod._buffers)):
            for pname, p in items.items():
                if isinstance(p, Tensor):
                    cands.append(Candidate(p, kind, pname))
        from .context import tensors_in

        for i, t in enumerate(tensors_in(args)):
            cands.append(Candidate(t, "input", f"input {i}", i))
        got = pick_odd(cands[:_MAX_CANDIDATES], amp)
    if got is None:
        return None
    odd, what, against = got
    rec = describe(odd, frames, exc, recorder)
    rec["differs"], rec["against"] = what, against
    rec["autocast"] = {d: dtype_name(t) for d, t in autocast.items()}
    if line_frame is not None and odd.role == "local":
        rec["used_at"] = file_line(line_frame.f_code.co_filename, line_of(line_frame, exc))
    return rec


def _user_frame_inside(mod: Any, exc: BaseException) -> Any:
    """The innermost frame of the user's code at or below `mod`'s forward in the traceback."""
    tb = exc.__traceback__
    inside = False
    found = None
    while tb is not None:
        f = tb.tb_frame
        if not inside and f.f_locals.get("self") is mod and f.f_code.co_name == "forward":
            inside = True
        if inside and user_file(f.f_code.co_filename):
            found = f
        tb = tb.tb_next
    return found


def origin_outside(exc: BaseException, recorder: Any) -> dict[str, Any] | None:
    """The odd tensor of a failure outside any module's forward (a loss, the backward):
    from the innermost frame of the user's code in the traceback."""
    frames = failure_frames(exc, live=False)
    user = [f for f in frames if user_file(f.f_code.co_filename)]
    if not user:
        return None
    frame = user[-1]
    line_no = line_of(frame, exc)
    autocast = _run_autocast(recorder)
    amp = set(autocast.values())
    got = pick_odd(_tensors_on_line(frame, line_no), amp) or pick_odd(_frame_tensors(frame), amp)
    if got is None:
        return None
    odd, what, against = got
    rec = describe(odd, frames, exc, recorder)
    rec["differs"], rec["against"] = what, against
    rec["used_at"] = file_line(frame.f_code.co_filename, line_no)
    rec["autocast"] = {d: dtype_name(t) for d, t in autocast.items()}
    return rec
