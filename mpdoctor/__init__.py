"""mpdoctor: a doctor for mixed-precision deep-learning training.

The Python API (the command line is `mpdoctor --help`)::

    import mpdoctor

    with mpdoctor.watch(model) as h:        # or an accelerate Accelerator; every=N samples steps
        ... train ...
    print(mpdoctor.render_findings(h.findings(), "markdown"))   # or "terminal", "json", "oneline"
    mpdoctor.print_findings(h.findings())                       # rich, in the terminal

    # in a transformers Trainer / a Lightning Trainer (the same instrumentation):
    from mpdoctor.integrations.transformers import MpdoctorCallback
    from mpdoctor.integrations.lightning import MpdoctorCallback

`import mpdoctor` imports neither torch nor rich: each name below is loaded when first used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
__all__ = ["Finding", "Report", "Watcher", "__version__", "print_findings", "render_findings", "watch"]

# name -> (module, attribute), imported on first use
_LAZY = {
    "watch": ("mpdoctor.api", "watch"),
    "Watcher": ("mpdoctor.api", "Watcher"),
    "Finding": ("mpdoctor.findings", "Finding"),
    "Report": ("mpdoctor.findings", "Report"),
}


def _as_report(findings: Any) -> Any:
    from .findings import Report

    if isinstance(findings, Report):
        return findings
    if hasattr(findings, "report") and callable(findings.report):  # a Watcher handle, a callback
        return findings.report()
    return Report(findings=list(findings or []))


def render_findings(findings: Any, format: str = "terminal", *, width: int | None = None,
                    anonymize: bool = False, verbose: bool = False) -> str:
    """Findings as text: `findings` is a list of Finding, a Report, a watch() handle or an
    integration callback; `format` one of "terminal" (no colours), "markdown" (for a
    GitHub issue), "json" (versioned, as `--format json`), "oneline" (one line each)."""
    from . import render

    if format not in ("terminal", "markdown", "json", "oneline"):
        raise ValueError(f"format must be terminal, markdown, json or oneline, not {format!r}")
    return render.render_text(_as_report(findings), format, anonymize=anonymize, verbose=verbose, width=width)


def print_findings(findings: Any, format: str = "terminal", *, stderr: bool = False, anonymize: bool = False,
                   verbose: bool = False) -> None:
    """Print findings as the command line does (rich panels in a terminal, NO_COLOR
    honoured); other formats as render_findings writes them."""
    from . import render

    if format == "oneline":
        import sys

        (sys.stderr if stderr else sys.stdout).write(render_findings(findings, format, anonymize=anonymize))
        return
    if format not in ("terminal", "markdown", "json"):
        raise ValueError(f"format must be terminal, markdown, json or oneline, not {format!r}")
    render.emit(_as_report(findings), format, stderr=stderr, anonymize=anonymize, verbose=verbose)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext mpdoctor` (IPython, Jupyter): see mpdoctor/notebook.py."""
    from .notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .notebook import unload_ipython_extension as unload

    unload(ipython)


def __getattr__(name: str) -> Any:
    # `mpdoctor.watch` needs torch; import it only when asked for, so that
    # `import mpdoctor` (and `mpdoctor explain`) never pulls torch in.
    target = _LAZY.get(name)
    if target is not None:
        import importlib

        value = getattr(importlib.import_module(target[0]), target[1])
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mpdoctor' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the public API, and the module's own dunders (no helper or typing names)
    return sorted(set(__all__) | {n for n in globals() if n.startswith("__") and n.endswith("__")})
