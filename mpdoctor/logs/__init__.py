"""The log pipeline: a log of any size in, ranked findings out.

    text or file ─► read (whole, or the regions a big log's scan keeps) ─► logtext.normalise
                 ─► engine.match (the log rules) ─► findings

Rooms: `explain` (the entry points every face calls), `read` (opening, sniffing the
encoding, whole or streamed), `regions` (the streaming scan and what it keeps),
`prefilter` (what the scan must look for, built from the rules), `scan_hyperscan` and
`scan_python` (the two literal scans, the same lines kept), `encoding` (text or not).
"""

from __future__ import annotations

from .encoding import looks_binary, sniff_encoding
from .explain import explain_case, explain_lines, explain_path, explain_text, matcher_for, prefilter_for
from .read import InputError, LogInput, read_log

__all__ = ["InputError", "LogInput", "explain_case", "explain_lines", "explain_path", "explain_text",
           "looks_binary", "matcher_for", "prefilter_for", "read_log", "sniff_encoding"]
