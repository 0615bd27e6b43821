"""Where the faces' evidence meets: one diagnosis from several kinds of rules.

A face gathers evidence of its own kind and judges it with its own rules (the log
pipeline: log text; env: a snapshot; run: a wrapped run's events; probe: one mode's
measurements). Some answers need several: a wrapped run is its output (log rules), the
environment it ran in (env rules) and its events (run rules); `explain --here` is a log
and a machine. Those compositions live here, above the faces, so that no face imports
another: `run` (a wrapped run's report), `sharpen` (a log finding on a machine's facts).
The rule base is always handed in by the caller (commands, the API), never loaded here.
"""
