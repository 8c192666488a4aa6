"""agentic-iqa: explainable image quality assessment (Planner → Executor → Summarizer over real IQA tools).

    from agentic_iqa import assess
    result = assess("photo.jpg", query="Rate the quality of this photo")
    print(result.score, result.level, result.answer)

    from agentic_iqa import create_assessor      # build once (tools, LMs, graph), call per image
    iqa = create_assessor(lm="openai/gpt-4o", device="cpu")
    print(iqa("photo.jpg").score)

    from agentic_iqa import assess_many          # many images, results as they complete
    for r in assess_many(["a.jpg", "b.png"], concurrency=8):
        print(r.item.image, r.result.score if r.ok else r.error)

Names are imported lazily so that `import agentic_iqa` (and the CLI's --help) stays fast.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["assess", "assess_async", "assess_many", "create_assessor", "Assessor", "AssessmentResult", "__version__"]


def __getattr__(name: str):
    if name in {"assess", "assess_async", "create_assessor", "Assessor", "AssessmentResult"}:
        from agentic_iqa import api

        return getattr(api, name)
    if name == "assess_many":
        from agentic_iqa import batch

        return batch.assess_many
    raise AttributeError(f"module 'agentic_iqa' has no attribute {name!r}")
