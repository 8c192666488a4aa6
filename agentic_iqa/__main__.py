"""`python -m agentic_iqa ARGS` runs the `agentic-iqa` command (same app; its heavy imports stay lazy)."""
from agentic_iqa.cli import app

if __name__ == "__main__":
    app(prog_name="python -m agentic_iqa")
