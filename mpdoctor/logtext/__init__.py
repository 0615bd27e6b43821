"""The one normaliser for log text, and the traceback segmenter.

Everything that reads a log (explain, run's captured tail and recorded exceptions, the
probe's failed modes, the rule self-tests) goes through `normalise()` and `segment()`.
Pasted logs are damaged in many ways (fixtures/logs/forms/ holds one of each): ANSI
colours, `\\r` progress bars, CRLF, rank and timestamp prefixes, rich boxes that wrap long
lines, Jupyter frames, tracebacks glued onto progress bars, flattened onto one line or
escaped inside a JSON string, full-width punctuation. This package turns them into clean
logical lines that keep their original line numbers, so that rules can be written against
the library's own message and evidence still points at the line the user pasted.

Rooms: `clean` (one physical line), `normalise` (physical lines -> logical lines),
`tracebacks` (frames, exceptions, chains), `lines` (the plain data they share).

Every regular expression here is applied to a bounded slice of a line (or is linear),
so a 20 MB line costs time proportional to its length, never more.
"""

from __future__ import annotations

from .clean import clean_physical_line, split_overwrites, strip_prefixes
from .lines import MAX_MATCH_CHARS, LazyRe, LogLine
from .normalise import normalise, split_logical
from .tracebacks import Frame, Traceback, exception_line, parse_frame, segment

__all__ = ["MAX_MATCH_CHARS", "Frame", "LazyRe", "LogLine", "Traceback", "clean_physical_line", "exception_line",
           "normalise", "parse_frame", "segment", "split_logical", "split_overwrites", "strip_prefixes"]
