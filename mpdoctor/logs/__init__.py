"""The log pipeline: a log of any size in, ranked findings out.

    text or file ─► read (whole, or the regions a big log's scan keeps) ─► logtext.normalise
                 ─► engine.match (the log rules) ─► findings

Rooms: `explain` (the entry points every face calls), `read` (opening, sniffing the
encoding, whole or streamed), `regions` (the streaming scan and what it keeps),
`prefilter` (what the scan must look for, built from the rules), `scan_hyperscan` and
`scan_python` (the two literal scans, the same lines kept), `encoding` (text or not).

A small input (a paste, a traceback, a log up to read.WHOLE_LIMIT) gets every repair for
damaged pastes on every line: case folded, lines a hard wrap cut joined again, markdown
and URL-encoding undone. A big log is scanned for what the rules say as written (a
program wrote it), and the same repairs apply in the regions kept around each hit.
"""

from __future__ import annotations

from .encoding import looks_binary, sniff_encoding
from .explain import explain_case, explain_lines, explain_path, explain_text, matcher_for, prefilter_for
from .read import InputError, LogInput, read_log

__all__ = ["InputError", "LogInput", "explain_case", "explain_lines", "explain_path", "explain_text",
           "looks_binary", "matcher_for", "prefilter_for", "read_log", "sniff_encoding"]
