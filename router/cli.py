"""`cost-router` command line.

Each area owns its sub-commands; heavy imports stay inside the commands.
"""

from __future__ import annotations

import typer

from router.commands.ab import ab_app
from router.commands.backends import backends_app
from router.commands.budget import budget_app, keys_app
from router.commands.classifier import classifier_app
from router.commands.config_reference import register_config_reference
from router.commands.distill import distill_app
from router.commands.drift import drift_app
from router.commands.grades import grades_app
from router.commands.levers import levers_app
from router.commands.promote import promote_cmd, rollback_cmd
from router.commands.serve import config_app, register_serve
from router.commands.simulate import register_simulation_commands

app = typer.Typer(
    name="cost-router",
    help="Cost-aware OpenAI-compatible LLM query router.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: typer's rich panels show every flag as `<bool>`, as if it took a value
    # (`--budgets true` is an error: a flag takes none).
    rich_markup_mode=None,
)
app.add_typer(classifier_app, name="classifier", help="Train, evaluate and run the classifier.")
# The learning loop's last step (router/commands/promote.py), in the classifier group.
classifier_app.command("promote")(promote_cmd)
classifier_app.command("rollback")(rollback_cmd)
app.add_typer(keys_app, name="keys", help="Manage API keys.")
app.add_typer(budget_app, name="budget", help="Show and manage team budgets.")
app.add_typer(ab_app, name="ab", help="A/B experiments between policies.")
app.add_typer(backends_app, name="backends", help="Plan and launch tier servers (vLLM, llama.cpp).")
app.add_typer(drift_app, name="drift", help="Drift of scores, large share and quality over time.")
app.add_typer(grades_app, name="grades", help="Import offline grades as labels beside the traces.")
app.add_typer(
    levers_app,
    name="levers",
    help="Measure quantization, distillation and speculative decoding on real prompts.",
)
app.add_typer(
    distill_app,
    name="distill",
    help="Distil a small student tier from the answers a large tier gave (docs/levers.md).",
)
register_serve(app)
register_config_reference(config_app)
register_simulation_commands(app)


if __name__ == "__main__":
    app()
