"""The logic of the environment rules (rules/env/*.toml): small pure functions of the
snapshot, one module per area they judge.

Each check gets an EnvView (the snapshot, the precision being judged and the plan
derived from both) and returns a list of Hits, one per thing that is wrong (per GPU,
per library, per setting), or a Skip saying why it cannot be judged here. A Hit's facts
fill the rule's templates; its evidence names the snapshot fields it rests on. A rule
names its check by function name; `engine.judge.checks_in(*MODULES)` collects them.
"""

from __future__ import annotations

from . import config, driver, libraries, memory, precision

# every module holding env checks, in the order a person reads the checklist
MODULES = (precision, driver, libraries, config, memory)
