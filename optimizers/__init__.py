"""DSPy optimizers for the agents: fixtures, per-module metrics, compile runs, saved programs.

- `optimizers.fixtures`: the JSONL fixture formats (fixtures/README.md) and loading.
- `optimizers.examples`: fixture lines as dspy.Examples.
- `optimizers.metrics`: one graded metric per module part, with feedback text.
- `optimizers.tasks`: the compilable parts of each agent module, run as the pipeline runs them.
- `optimizers.runner`: evaluate → optimize (LabeledFewShot, BootstrapFewShot, MIPROv2, GEPA) → evaluate.
- `optimizers.demo_lm`: the scripted offline demo LM behind `--lm demo` (not a model).
- `optimizers.record`: saved assessments → fixture lines.
- `optimizers.build_fixtures`: regenerates the shipped fixtures.

Depends on dspy, signatures and agentic_iqa.agents / agentic_iqa.programs; the command line
(`agentic-iqa compile`, `agentic-iqa fixtures record`) lives in agentic_iqa.cli.compile.
`build_fixtures` alone also uses the synthetic benchmark generator and the tool registry.
"""
