"""The instrumentation's way into the command: a private folder holding a copy of
instrument/boot (a sitecustomize put first on PYTHONPATH) and the folder where each
instrumented process writes its events (instrument/events.py).

The folder is made in $TMPDIR when that is set (as mktemp does: the user said where
temporary files go), else in the first writable of /tmp, /var/tmp and /dev/shm (a
container with a read-only root filesystem usually keeps /dev/shm writable). Never in
the working directory. When none is writable the command still runs, uninstrumented:
`make_workdir` says why, and the run's diagnosis reads the command's output only."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_TEMP_DIRS", "child_env", "make_workdir"]

DEFAULT_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def make_workdir() -> tuple[Path | None, str | None]:
    """(the private folder, None), or (None, why no folder could be made)."""
    tmpdir = os.environ.get("TMPDIR")
    bases = [tmpdir] if tmpdir else list(DEFAULT_TEMP_DIRS)
    why = []
    for base in bases:
        try:
            workdir = Path(tempfile.mkdtemp(prefix="mpdoctor-run-", dir=base))
        except OSError as exc:
            why.append(f"{base}: {exc.strerror or exc}")
            continue
        try:
            (workdir / "events").mkdir()
        except OSError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            why.append(f"{base}: {exc.strerror or exc}")
            continue
        return workdir, None
    where = "TMPDIR " if tmpdir else ""
    return None, f"no writable temporary folder ({where}{'; '.join(why)})"


def _boot_dir(workdir: Path) -> Path:
    """A copy of instrument/boot with its bytecode compiled, so the child's interpreter
    loads it without compiling (PYTHONDONTWRITEBYTECODE is common in containers). Where
    the copy cannot be made (a full disk), the package's own folder serves."""
    src = Path(__file__).parent.parent / "instrument" / "boot" / "sitecustomize.py"
    boot = workdir / "boot"
    try:
        boot.mkdir()
        dst = boot / "sitecustomize.py"
        shutil.copyfile(src, dst)
    except OSError:
        return src.parent
    try:
        import importlib.util
        import py_compile

        py_compile.compile(str(dst), cfile=importlib.util.cache_from_source(str(dst)), doraise=True)
    except Exception:  # the source works too, a little slower
        pass
    return boot


def child_env(workdir: Path | None) -> dict[str, str]:
    """The child's environment: ours, with the instrumentation's boot folder first on
    PYTHONPATH and its events folder named, when there is a `workdir`."""
    env = dict(os.environ)
    if workdir is None:
        return env
    from ..instrument.events import ENV_DIR

    boot = _boot_dir(workdir)
    env["PYTHONPATH"] = str(boot) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[ENV_DIR] = str(workdir / "events")
    env["MPDOCTOR_PKG_ROOT"] = str(Path(__file__).resolve().parent.parent.parent)
    return env
