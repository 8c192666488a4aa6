"""The Planner, Executor and Summarizer modules. Import submodules directly (kept empty so importing
one agent does not import the others, or DSPy before it is needed)."""
