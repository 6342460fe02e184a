"""The `cost-router` command groups: the one place that owns commands. Each module parses options,
loads the config (router/commands/common.py) and hands the sections it needs to the area's
library code.

Commands import their area's heavy modules inside the command function, not at the top: every
command module is imported to build `cost-router --help`, and no command should pay for another's
scikit-learn, onnxruntime, pyarrow, matplotlib or redis-py. These are the only function-local
imports of our own packages besides a few marked ones (the demo's server stack, redis-py for
`store: redis`, onnxruntime for rescoring reference traces); none of them dodges an import cycle
(`lint-imports` checks that no package has one).
"""
