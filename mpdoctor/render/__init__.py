"""The renderers every face shares: terminal, oneline, json, markdown, and check's
checklist.

They take a Report (plain data) and nothing else, and print nothing themselves: each
returns a string or writes to the console it is given. Every one of them scrubs the
report first (mpdoctor/redact.py: secrets always, home/user/host with --anonymize), so
whatever leaves mpdoctor through them carries no secret.

The terminal layout is plain indented text (no panels): URLs, commands and code spans
are never cut by wrapping (lines break at spaces, a `code span` or URL stays whole on
its line even when it is longer than the terminal), no line carries trailing padding.

One module per idea: text (wrapping, widths, tables, sparklines), common (the scrubbed
copy, JSON, facts and evidence lines), markdown, terminal (and oneline, the console,
`emit`), checklist (check's areas and tables).
"""

from __future__ import annotations

from .checklist import emit_checklist, print_checklist, to_checklist_markdown
from .common import FORMATS, SCHEMAS, STYLE, SYMBOL, clean_report, evidence_lines, to_json
from .markdown import environment_from_snapshot, gpu_summary, to_markdown
from .terminal import (
    DEFAULT_WIDTH,
    emit,
    make_console,
    print_terminal,
    print_unpadded,
    render_text,
    say,
    terminal_columns,
    to_oneline,
)
from .text import _UNIT, bar, cells, markdown_table, sparkline, table_lines, wrap

__all__ = [
    "DEFAULT_WIDTH", "FORMATS", "SCHEMAS", "STYLE", "SYMBOL", "bar", "cells", "clean_report", "emit",
    "emit_checklist", "environment_from_snapshot", "evidence_lines", "gpu_summary", "make_console",
    "markdown_table", "print_checklist", "print_terminal", "print_unpadded", "render_text", "sparkline",
    "table_lines", "terminal_columns", "to_checklist_markdown", "to_json", "to_markdown", "to_oneline", "wrap",
    "_UNIT", "say",
]
