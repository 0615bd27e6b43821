"""The rule engine: rules as data (rule, loader, rule cache, patterns), matching log
rules (match, wraps, log_findings, likely), judging predicate rules over JSON evidence
(judge), the one assembler from a rule and its facts to a finding (assemble, template,
frames) and the declared fact vocabulary (facts, derive/). It imports no face."""
