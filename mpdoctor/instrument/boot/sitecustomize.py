"""mpdoctor's way into a wrapped Python process (`mpdoctor run` puts this folder first
on PYTHONPATH, so every Python child — through `accelerate launch` and `torchrun` too —
runs it at startup).

It costs nothing measurable: it imports nothing beyond what the interpreter already
loaded, chains to the sitecustomize this one hides, and adds an import hook that waits
for `import torch` to *finish* before it starts the instrumentation. A process that never
imports torch never loads any more of mpdoctor. Any error here is swallowed.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _shadowed():
    # Python imports the first sitecustomize on sys.path, which is this one; find the
    # one it shadows (a distribution's or a venv's) to run it exactly as it would have run.
    try:
        # the frozen importlib the interpreter already runs on: importing `importlib`
        # itself would cost a millisecond
        PathFinder = sys.modules["_frozen_importlib_external"].PathFinder
        paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = PathFinder.find_spec("sitecustomize", paths)
        return spec if spec is not None and spec.loader is not None else None
    except Exception:
        return None


def _chain(spec):
    module = sys.modules["_frozen_importlib"].module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors reach site.py as they would have


class _Loader:
    """Runs the real loader, then tells mpdoctor the module is ready."""

    def __init__(self, real, name):
        self.real = real
        self.name = name

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self.real
        module.__loader__ = self.real
        self.real.exec_module(module)  # torch's own errors propagate untouched
        _ready(self.name)

    def __getattr__(self, attr):
        return getattr(self.real, attr)


class _WhenImported:
    """A meta-path finder that only ever answers for `torch` and `accelerate`."""

    names = ("torch", "accelerate")

    def __init__(self):
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name not in self.names or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        except Exception:
            return None
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, name)
        return spec


def _ready(name):
    try:
        try:
            from mpdoctor import api
        except ImportError:
            # The child may run another interpreter/venv than mpdoctor's: borrow our copy,
            # appended last so that it shadows nothing of the user's.
            root = os.environ.get("MPDOCTOR_PKG_ROOT")
            if not root:
                return
            sys.path.append(root)
            try:
                from mpdoctor import api
            finally:
                if root in sys.path:
                    sys.path.remove(root)
        api.instrument_process(name)
    except Exception:
        pass


if os.environ.get("MPDOCTOR_EVENTS_DIR"):
    try:
        sys.meta_path.insert(0, _WhenImported())
    except Exception:
        pass
_spec = _shadowed()
if _spec is not None:
    _chain(_spec)
