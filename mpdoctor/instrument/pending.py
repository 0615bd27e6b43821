"""The values the hooks and taps leave on the devices, unread, and the once-per-step read
that copies them to the host in one go (one sync per device) and hands them to
``readout.Readout`` (what they show: non-finite values, overflow, the loss scale).

A step's values are read when the next step begins, at ``flush()``, when the handle's
records are asked for, at an error and at exit. See readout.py for the layout of `meta`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .readout import Readout


class PendingValues:
    """The recorder's pending values and their read (a mixin of ``recorder.Recorder``)."""

    def _init_pending(self) -> None:
        self.readout = Readout(self.name_of)
        if self.every > 1:
            self.readout.sampled = self._is_sampled
        # pending on-device values, per device: 0-d tensors (stacked at flush) and vectors;
        # `_meta` describes each (see readout.py)
        self._scalars: dict[Any, list[Tensor]] = {}
        self._vectors: dict[Any, list[Tensor]] = {}
        self._meta: list[tuple] = []
        self._out_cache: dict[int, tuple[Any, int]] = {}
        self._gen = 0  # +1 at every flush: indices into _meta are only valid within one
        self._gin: dict[int, tuple[Any, list]] = {}

    def _pend_pair(self, kind: str, a: Tensor, b: Tensor) -> None:
        dev = a.device
        lst = self._scalars.setdefault(dev, [])
        lst.append(a)
        lst.append(b)
        self._meta.append((kind, None, dev, len(lst) - 2, -1, self.step, a.dtype))

    def _pend_vector(self, kind: str, vec: Tensor, names: Any) -> None:
        dev = vec.device
        pending = self._vectors.setdefault(dev, [])
        pending.append(vec)
        off = sum(v.numel() for v in pending[:-1])
        self._meta.append((kind, None, dev, off, (vec.numel(), names), self.step, vec.dtype))

    def flush(self) -> None:
        """Copy the pending values to the host (one sync per device) and look at them."""
        try:
            if self.disabled or not self._meta:
                self._out_cache.clear()
                return
            meta, scalars, vectors = self._meta, self._scalars, self._vectors
            self._meta, self._scalars, self._vectors = [], {}, {}
            self._gen += 1
            self._out_cache.clear()
            self._gin.clear()
            found = self.readout.read(meta, scalars, vectors, self.plan_tracker.scaler_active(), self._primary)
            if self.readout.held_loss is not None and self._escalated_from is not None and \
                    self.step >= self._escalated_from:
                found |= self.readout.release_held()  # a watched step did not name a module
            if found:
                self._emit()
        except Exception as exc:
            self._fail(exc)

    def _current(self) -> Readout:
        """The readout with nothing left pending: what the handle's properties show."""
        if self._meta and not self.disabled:
            self.flush()
        return self.readout
