"""A shared job folder (`mpdoctor run --job-dir DIR`, or MPDOCTOR_JOB_DIR): each node's
run writes its report there (host, ranks, environment, precision plan), and its ranks'
Flight Recorder dumps and hang stacks; `mpdoctor explain DIR` reads the job. No server:
a folder every node can write (a shared filesystem), one file per node.

    DIR/<host>-<pid>.report.json     one per node (mpdoctor run's JSON report + "node")
    DIR/flight/<host>-rank_<N>       the Flight Recorder dumps (torch writes them)
    DIR/stacks/<host>-rank<N>.txt    the stacks a hang or SIGUSR1 captured (instrument/hang.py)
"""

from __future__ import annotations

import os
import socket
from typing import Any

# torch's Flight Recorder: entries kept per rank (0 turns it off), and where NCCL's watchdog
# dumps them on a timeout (the file name is this prefix and the rank)
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT")
FR_ENTRIES = "2000"


def prepare_job_dir(job_dir: str) -> str | None:
    """Make the folder (and its flight/, stacks/) and turn the Flight Recorder on for the
    command's processes (unless the user set it): why not, or None."""
    host = _host()
    try:
        for sub in ("", "flight", "stacks"):
            os.makedirs(os.path.join(job_dir, sub), exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(job_dir, os.W_OK | os.X_OK):
        return "Permission denied"
    # the child's environment is ours (run.inject.child_env copies os.environ)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_ENTRIES)
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(os.path.abspath(job_dir), "flight", f"{host}-rank_"))
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ["MPDOCTOR_JOB_DIR"] = os.path.abspath(job_dir)
    return None


def _host() -> str:
    name = socket.gethostname() or "node"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]


def write_node_report(job_dir: str, report: Any, cmd: list[str], result: Any, records: list[Any],
                      anonymize: bool = False) -> str | None:
    """This node's report in the job folder; the path written, or None (said on stderr)."""
    import sys

    from .. import render
    from ..run.evidence import build_evidence
    from .nodes import node_block

    block = node_block(build_evidence(cmd, result, records), report.extra.get("precision_plan"))
    block["name"] = block["host"] = _host()
    report.extra["node"] = block
    path = os.path.join(job_dir, f"{_host()}-{os.getpid()}.report.json")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(render.render_text(report, "json", heading=f"mpdoctor run (exit status {result.exit_code})",
                                        anonymize=anonymize, verbose=False, schema=render.SCHEMAS["run"],
                                        where="run"))
    except OSError as exc:
        if sys.stderr is not None:
            sys.stderr.write(f"mpdoctor run: cannot write this node's report in the job folder {job_dir}: "
                             f"{exc.strerror or exc}\n")
        return None
    return path
