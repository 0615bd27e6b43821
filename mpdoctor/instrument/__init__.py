"""Instrumentation that runs inside a training process (the only part of mpdoctor,
with env/ collectors, that touches torch). It records; it never judges, and it imports
no face of mpdoctor (knowledge/ only): the run face judges what it recorded.

Two ways in, one implementation (`recorder.Recorder`):

* ``mpdoctor run -- CMD`` puts ``instrument/boot/`` on ``PYTHONPATH``; its
  ``sitecustomize`` waits for ``import torch`` to complete (an import hook: it never
  imports torch itself) and then starts a process-wide recorder (``auto.start``, through
  ``mpdoctor.api``) that writes its events, per rank, to the JSONL files the wrapper reads.
* ``mpdoctor.watch(model_or_accelerator)`` in your own code (``mpdoctor.api``: this
  recorder with findings() on top), or ``instrument.watch`` in the probe's child.

The recorder ``watch()`` returns (``mpdoctor.watch()``'s handle has the same attributes)::

    h = mpdoctor.watch(model)            # or an accelerate Accelerator (before or after prepare)
    h = mpdoctor.watch(model, every=4)   # sampled: modules watched on steps 0, 4, 8, ... only
    ... train ...
    h.autocast_dtype    # "bfloat16" / "float16" / "float32": output dtype of the first
                        # nn.Linear / conv seen (what autocast really ran); None before any
    h.plan              # PrecisionPlan: requested mixed_precision, autocast_dtype, param
                        # dtypes (trainable/frozen, element counts), grad_scaler, fp32 master
                        # weights, distributed type, num_processes, prepared; .to_dict()
    h.scaler            # ScalerTimeline: .scales [(step, scale)], .skipped_steps [step, ...],
                        # .final_scale (float | None), .to_dict()
    h.skipped_steps     # shortcut: h.scaler.skipped_steps
    h.optimizer_step_was_skipped  # accelerate's flag for the last step (Accelerator watched)
    h.final_scale       # shortcut: h.scaler.final_scale
    h.nonfinite         # [NonFinite]: first non-finite value per phase, each with .module
                        # (qualified name as in named_modules()), .phase ("forward" |
                        # "backward"), .step (0-based optimizer step), .dtype, .kind
                        # ("nan" | "inf"), .input_min / .input_max; .to_dict()
    h.first_nonfinite   # the first of them, or None
    h.step              # the current 0-based step, as the loop counts them: optimizer steps
                        # (instrument/steps.py); evaluation forwards are not steps; -1 before
                        # the first forward
    h.micro             # the training forward (micro-batch) within the step (gradient accumulation)
    h.optimizer_steps   # optimizer (or loss scaler) steps completed
    h.errors            # [RaisedError]: exceptions raised in the training, with their context
    h.recovered         # [RaisedError]: exceptions caught, after which an optimizer step completed
    h.unhooked          # [{"module", "module_type", "reason"}]: modules that took no hooks
                        # (a TorchScript submodule), skipped; the rest is watched
    h.flush()           # read the on-device statistics now (one host sync); done for you at
                        # each step boundary, when nonfinite/scaler are read, and at exit
    h.findings()        # (mpdoctor.watch only) [mpdoctor.findings.Finding], root cause first
    h.report()          # (mpdoctor.watch only) mpdoctor.findings.Report
    h.close()           # remove every hook; also `with mpdoctor.watch(m) as h: ...`

Sampling (``every=N``; ``MPDOCTOR_WATCH_EVERY=N`` for ``mpdoctor run``, whose
process-wide watcher is also what watch() returns there): the per-module reductions (outputs, gradients) and the
per-parameter gradient norms run on every Nth step only (steps 0, N, 2N, ...), so the
cost on a model with thousands of modules is about 1/N of the full one. The loss, the
loss scale (skipped steps) and exceptions (with their context) are still recorded on
every step: a NaN that first appears on a step that is not sampled is reported at the
loss, with its step; the module that made it is named when it appears on a sampled
step, and from then on every step is watched. With ``watch(model)`` (and the
integrations) the submodules' hooks are removed on the steps that are not sampled, so
those steps cost almost nothing even with thousands of modules; an exception raised there
is still attributed to the innermost module it went through (from its traceback). Under
``mpdoctor run`` the hooks are process-wide and stay: a step not sampled costs the hook
calls only. Whole steps are sampled rather than a rotating subset of modules because the
first module to go non-finite is only known when every module of that step is watched.

Detection costs no host synchronisation per module: each module's output (and each
gradient, through tensor hooks) is reduced on its device to a (min, max) pair that is
read once per step; details (names, input ranges, memory) are gathered only when
something is found. Code running under torch.compile or jit tracing is not watched (the
hooks step aside there rather than enter the user's graph). Everything fails open: an error inside the instrumentation is kept
as an ``info`` finding and never reaches the training (``MPDOCTOR_INSTRUMENT_FAIL=1``
forces such an error, for the tests).
"""

from __future__ import annotations

from typing import Any

__all__ = ["watch"]


def watch(obj: Any = None, **kwargs: Any) -> Any:
    """Record a torch.nn.Module or an accelerate Accelerator; returns a Recorder (see the
    module docstring). With no argument, records every module in the process."""
    from .recorder import watch as _watch

    return _watch(obj, **kwargs)
