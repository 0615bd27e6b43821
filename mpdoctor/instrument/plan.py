"""The precision plan: what the training really runs in, next to what it asked for.

The watcher's hooks and the process-wide taps report what they meet (matmul outputs,
optimizers, loss scalers, accelerate's Accelerator and what it prepared); the tracker
tells what is trained from what is only called (a frozen teacher's no_grad forward is
not what the training ran in) and fills a PrecisionPlan from it.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Callable

import torch
from torch import Tensor

from ..knowledge import intent
from ..knowledge.dtypes import dtype_name
from . import context
from .records import PrecisionPlan

# Modules whose output dtype shows what autocast ran: the plan's "first matmul".
MATMUL_TYPES: tuple[type, ...] = (torch.nn.Linear, torch.nn.Bilinear, torch.nn.Conv1d, torch.nn.Conv2d,
                                  torch.nn.Conv3d)
# Matmul modules remembered until what is trained is known.
_MAX_MATMULS = 64
_LOW = (torch.float16, torch.bfloat16)


class PlanTracker:
    """The PrecisionPlan of one watcher, and what it is inferred from."""

    def __init__(self, name_of: Callable[[Any], str]) -> None:
        self.plan = PrecisionPlan()
        self.accelerators: list[Any] = []
        self._name_of = name_of
        self._scalers: list[Any] = []
        self._optimizer_ids: set[int] = set()
        # what is trained: the optimizers' parameters and the modules accelerate prepared
        self._optimizers: list[Any] = []        # weakrefs to optimizers
        self._prepared: list[Any] = []          # weakrefs to prepared modules
        # the first Linear/conv outputs seen: (weakref module, name, dtype, autocast on,
        # device type), so that the plan can name the first matmul of a *trained* module
        self._matmuls: list[tuple[Any, str, str, bool, str]] = []
        self._sample: list[tuple[Tensor, Tensor]] | None = None
        self._sampled = False
        # a LightningModule is watched: Lightning trains it, and never reads ACCELERATE_MIXED_PRECISION
        self._lightning = False

    # ---- what is trained -------------------------------------------------------------
    def count_root(self, root: Any) -> None:
        """Count the outermost module's parameters: only a fallback, until an optimizer
        steps or accelerate prepares a model (see _trained_params)."""
        if _lightning_trains(root):
            self._lightning = True
        if not self._prepared and not self._optimizers:
            self._set_param_counts(list(root.parameters()))

    def _trained_params(self) -> list[Tensor] | None:
        """The parameters the training updates or prepared, or None before either is known."""
        params: dict[int, Tensor] = {}
        known = False
        for ref in self._optimizers:
            opt = ref()
            if opt is not None:
                known = True
                for g in opt.param_groups:
                    for p in g["params"]:
                        params[id(p)] = p
        for ref in self._prepared:
            m = ref()
            if m is not None:
                known = True
                for p in m.parameters():
                    params.setdefault(id(p), p)
        return list(params.values()) if known else None

    def _set_param_counts(self, params: list[Tensor]) -> None:
        counts: dict[str, dict[str, int]] = {"trainable": {}, "frozen": {}}
        devices: dict[str, int] = {}
        for p in params:
            side = counts["trainable" if p.requires_grad else "frozen"]
            key = dtype_name(p.dtype)
            side[key] = side.get(key, 0) + p.numel()
            devices[p.device.type] = devices.get(p.device.type, 0) + p.numel()
        self.plan.params = counts
        if devices:
            self.plan.device = max(devices, key=devices.get)  # type: ignore[arg-type]

    def _refresh_counts(self) -> None:
        trained = self._trained_params()
        if trained is not None:
            self._set_param_counts(trained)
            if self._matmuls:
                self._settle_matmul()

    # ---- the first matmul --------------------------------------------------------------
    def note_matmul(self, mod: Any, t: Tensor) -> bool:
        """A Linear/conv module produced `t`; returns whether more of them are wanted."""
        if any(ref() is mod for ref, *_ in self._matmuls):
            return True
        state = context.autocast_state()
        self._matmuls.append((weakref.ref(mod), self._name_of(mod), dtype_name(t.dtype),
                              bool(state.get(t.device.type)), t.device.type))
        if self.plan.autocast_dtype is None:
            self._settle_matmul()
        return len(self._matmuls) < _MAX_MATMULS

    def _settle_matmul(self) -> None:
        """The plan's first matmul: the first one seen of a trained module (any module
        until what is trained is known)."""
        trained = self._trained_params()
        ids = {id(p) for p in trained} if trained is not None else None
        for ref, name, dtype, enabled, _device in self._matmuls:
            m = ref()
            if ids is not None and (m is None or not any(id(p) in ids for p in m.parameters(recurse=False))):
                continue
            self.plan.autocast_dtype, self.plan.autocast_module, self.plan.autocast_enabled = dtype, name, enabled
            return

    # ---- optimizers ----------------------------------------------------------------------
    def on_optimizer(self, opt: Any, params: list[Tensor]) -> None:
        """An optimizer about to step (`params`: its parameters); noted the first time."""
        if id(opt) in self._optimizer_ids:
            return
        self._optimizer_ids.add(id(opt))
        self._optimizers.append(weakref.ref(opt))
        name = type(opt).__name__
        inner = getattr(opt, "optimizer", None)  # accelerate's AcceleratedOptimizer wraps one
        if inner is not None and name.startswith("Accelerated"):
            name = type(inner).__name__
        self.plan.optimizers = list(dict.fromkeys([*self.plan.optimizers, name]))
        eps = [g.get("eps") for g in getattr(opt, "param_groups", []) if isinstance(g.get("eps"), (int, float))]
        if eps:
            low = min(eps)
            self.plan.optimizer_eps = low if self.plan.optimizer_eps is None else min(low, self.plan.optimizer_eps)
        dtypes: dict[str, int] = dict(self.plan.optimizer_param_dtypes)
        for p in params:
            key = dtype_name(p.dtype)
            dtypes[key] = dtypes.get(key, 0) + p.numel()
        self.plan.optimizer_param_dtypes = dtypes
        trainable_low = any(p.dtype in _LOW and p.requires_grad for p in params)
        self.plan.fp32_master_weights = not trainable_low
        self._refresh_counts()

    def before_step(self, with_grad: list[Tensor]) -> None:
        """Once, when low-precision weights are trained: keep a few thousand of them to
        see whether one step moved them."""
        if self._sampled or not any(p.dtype in _LOW for p in with_grad):
            return
        self._sampled = True
        self._sample = [(p, p.detach().reshape(-1)[:4096].clone()) for p in with_grad[:64]
                        if p.dtype in _LOW and p.requires_grad]

    def after_step(self) -> bool:
        """The share of the sampled weights the step left unchanged although their
        gradient was not zero; returns whether the plan learned it."""
        if self._sample is None:
            return False
        sample, self._sample = self._sample, None
        unchanged = total = 0
        for p, before in sample:
            now = p.detach().reshape(-1)[: before.numel()]
            g = p.grad.detach().reshape(-1)[: before.numel()] if p.grad is not None else None
            moving = g != 0 if g is not None else torch.ones_like(now, dtype=torch.bool)
            unchanged += int(((now == before) & moving).sum())
            total += int(moving.sum())
        if not total:
            return False
        self.plan.unchanged_fraction = unchanged / total
        self.plan.unchanged_sampled = total
        return True

    # ---- loss scalers ---------------------------------------------------------------------
    def on_scaler_created(self, scaler: Any) -> None:
        self._scalers.append(scaler)
        self.plan.grad_scaler = True
        self.plan.grad_scaler_enabled = bool(getattr(scaler, "_enabled", True))

    def on_scaler_seen(self, scaler: Any) -> None:
        if not any(s is scaler for s in self._scalers):
            self.on_scaler_created(scaler)

    def scaler_active(self) -> bool:
        return any(getattr(s, "_enabled", False) for s in self._scalers)

    # ---- accelerate ---------------------------------------------------------------------
    def add_accelerator(self, acc: Any) -> bool:
        """Returns whether `acc` is new. The first one: every source that asked it for a
        precision (the plan's `sources`)."""
        if any(a is acc for a in self.accelerators):
            return False
        self.accelerators.append(acc)
        if len(self.accelerators) == 1:
            try:
                self.plan.sources = intent_sources(acc)
            except Exception:  # what asked is a nicety: never in the training's way
                pass
        return True

    def on_prepare(self, objs: tuple) -> None:
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                self.plan.prepared["model"] = True
                self._prepared.append(weakref.ref(obj))
                self._refresh_counts()
            elif isinstance(obj, torch.optim.Optimizer) or hasattr(obj, "optimizer"):
                self.plan.prepared["optimizer"] = True

    @property
    def optimizer_step_was_skipped(self) -> bool | None:
        flags = [getattr(a, "optimizer_step_was_skipped", None) for a in self.accelerators]
        flags = [f for f in flags if f is not None]
        return any(flags) if flags else None

    def refresh(self, fail: Callable[[BaseException], None]) -> None:
        """What the accelerators say now (they change as the training sets up), else the
        environment; an accelerator that cannot be read goes to `fail`."""
        for acc in self.accelerators:
            try:
                self.plan.requested = str(getattr(acc, "mixed_precision", None) or "no")
                self.plan.distributed_type = str(getattr(acc, "distributed_type", "")).replace("DistributedType.", "")
                self.plan.num_processes = int(getattr(acc, "num_processes", 1))
                scaler = getattr(acc, "scaler", None)
                if scaler is not None:
                    self.on_scaler_seen(scaler)
            except Exception as exc:
                fail(exc)
        # no Accelerator seen (one whose __init__ raised, or a plain loop under `accelerate
        # launch --mixed_precision bf16`): the launcher's variable is what was asked for,
        # except under Lightning, which never reads it
        if self.plan.requested is None and os.environ.get("ACCELERATE_MIXED_PRECISION") and not self._lightning:
            self.plan.requested = os.environ["ACCELERATE_MIXED_PRECISION"]
        if self.plan.num_processes is None and os.environ.get("WORLD_SIZE"):
            self.plan.num_processes = int(os.environ["WORLD_SIZE"])
        if self.plan.distributed_type is None:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    self.plan.distributed_type = f"torch.distributed ({dist.get_backend()})"
            except Exception:
                pass


# ---- precision intent ---------------------------------------------------------------------

def intent_sources(acc: Any) -> list[dict[str, Any]]:
    """Where the precision of Accelerator `acc` was asked for: the `accelerate launch`
    that started this process (its flag, its config file), ACCELERATE_MIXED_PRECISION,
    and the code's own argument (an `Accelerator(mixed_precision=...)` line, or the
    Trainer's TrainingArguments). Called from inside Accelerator.__init__'s tap."""
    sources = intent.launch_sources(_parent_argv())
    if not sources and os.environ.get("ACCELERATE_MIXED_PRECISION"):
        # under accelerate launch the variable is the launcher's (its flag or config):
        # said once, as those
        sources.append({"source": intent.ENV, "value": os.environ["ACCELERATE_MIXED_PRECISION"].strip(),
                        "where": None})
    code = _code_argument(acc)
    if code:
        sources.append(code)
    return sources


def _lightning_trains(root: Any) -> bool:
    """Lightning drives this forward (a LightningModule, or Lightning's loop on the stack of
    the first forward: its training_step calls an inner module). Looked at once a run."""
    if any(c.__name__ == "LightningModule" for c in type(root).__mro__):
        return True
    f = sys._getframe(1)
    for _ in range(80):
        if f is None:
            return False
        name = f.f_code.co_filename.replace("\\", "/")
        if "/lightning/" in name or "/pytorch_lightning/" in name:
            return True
        f = f.f_back
    return False


def _parent_argv() -> list[str]:
    """The command line of the process that started this one (Linux), else []."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            raw = fh.read(64 * 1024)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _code_argument(acc: Any) -> dict[str, Any] | None:
    """The mixed_precision the code handed Accelerator(...) `acc`, found in the frame of
    the __init__ tap (its `args`/`kwargs`); who called it decides the source."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None
        if frame.f_code.co_name == "__init__":
            loc = frame.f_locals
            if loc.get("self") is acc and isinstance(loc.get("kwargs"), dict) and isinstance(loc.get("args"), tuple):
                break
        frame = frame.f_back
    else:
        return None
    args, kwargs = loc["args"], loc["kwargs"]
    value = kwargs.get("mixed_precision", args[2] if len(args) > 2 else None)
    caller = frame.f_back
    while caller is not None and caller.f_code.co_name == "__init__" and caller.f_locals.get("self") is acc:
        caller = caller.f_back  # a subclass of Accelerator calling super().__init__
    if caller is None:
        return None
    filename = caller.f_code.co_filename.replace("\\", "/")
    where = f"{filename}:{caller.f_lineno}"
    if "/transformers/" in filename:
        targs = getattr(caller.f_locals.get("self"), "args", None)
        if getattr(targs, "fp16", False):
            return {"source": intent.TRAINER_ARGS, "value": "fp16", "where": None}
        if getattr(targs, "bf16", False):
            return {"source": intent.TRAINER_ARGS, "value": "bf16", "where": None}
        return None  # the Trainer passed on what the environment said
    if value is None or "/accelerate/" in filename or "/lightning/" in filename:
        return None
    return {"source": intent.ACCELERATOR_ARG, "value": str(getattr(value, "value", value)), "where": where}
