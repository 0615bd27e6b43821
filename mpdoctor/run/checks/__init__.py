"""The checks of the run rules (rules/run/*.toml): small pure functions of a RunView.

Each returns Hits (facts for the rule's templates, and the fields of the run evidence
they rest on) or a Skip. The rule files hold the words; these modules only say when, and
with which facts. One module per kind of question:

- values: non-finite values, magnitudes and headroom, activations near a limit, the loss scaler
- plan: the precision plan, what was asked for and what ran, processes that did not join
- recipe: the AMP recipe (the order of the scaler, clip and optimizer calls)
- outcome: how the run ended (a kill, each rank's story, OOMs caught and survived)
"""

# every module of this package that holds @check functions (the run face judges with all)
MODULES = ("values", "plan", "recipe", "outcome")
