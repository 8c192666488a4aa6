"""`agentic-iqa` command line. Sub-commands live in sibling modules; heavy imports stay inside commands
so that `agentic-iqa --help` does not pay for torch, pyiqa or DSPy."""
from __future__ import annotations

from agentic_iqa.cli import assess as _assess
from agentic_iqa.cli import bench as _bench
from agentic_iqa.cli import compile as _compile
from agentic_iqa.cli import tools as _tools
from agentic_iqa.cli.output import GuardedApp

app = GuardedApp(
    name="agentic-iqa",
    help="Explainable image quality assessment with a planner, an executor and a summarizer over real IQA tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_tools.app, name="tools")
app.command("assess")(_assess.assess_command)
app.command("compile")(_compile.compile_command)
app.add_typer(_compile.fixtures_app, name="fixtures")
app.add_typer(_bench.app, name="bench")
app.command("eval")(_bench.eval_command)


def main() -> None:
    app()
