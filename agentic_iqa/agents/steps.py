"""One body for the sync and the async assessment: steps that yield their LM calls.

A role method or graph node written as a generator yields an `LMCall` wherever it needs the model and
receives its result (or has its exception raised at the `yield`). `run_sync` answers each call with
`module(...)` in the calling thread (`graph.invoke`); `run_async` answers it with `await module.acall(...)`
(DSPy's `aforward`, the LM's async client) on the event loop and runs the work between calls (image
statistics, tool runs, parsing) in a worker thread, so `graph.ainvoke` never blocks the loop and holds no
thread while it waits for the model. Roles without a model (the offline analyst) return plain values:
`steps()` accepts both.
"""
from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any, Generator, TypeVar

T = TypeVar("T")
Steps = Generator["LMCall", Any, T]


@dataclass
class LMCall:
    """One model call: `module(**kwargs)` with `lm` (and DSPy's history settings) in context."""

    module: Any
    lm: Any
    kwargs: dict
    dspy_context: dict = field(default_factory=dict)

    requests: int = 0  # HTTP requests the call sent, retries included (counted by agentic_iqa.lm), also on failure

    def run(self) -> Any:
        import dspy

        from agentic_iqa.lm import metering

        with metering() as sent:
            try:
                with dspy.context(lm=self.lm, **self.dspy_context):
                    return self.module(**self.kwargs)
            finally:
                self.requests = sent.requests

    async def arun(self) -> Any:
        import dspy

        from agentic_iqa.lm import metering

        with metering() as sent:
            try:
                with dspy.context(lm=self.lm, **self.dspy_context):
                    return await self.module.acall(**self.kwargs)
            finally:
                self.requests = sent.requests


def steps(value: Any) -> Steps:
    """`yield from steps(x)`: the steps of a generator, or a plain value as it is."""
    if inspect.isgenerator(value):
        return (yield from value)
    return value


def run_sync(gen: Steps[T]) -> T:
    send, value = gen.send, None
    while True:
        try:
            call = send(value)
        except StopIteration as stop:
            return stop.value
        try:
            value, send = call.run(), gen.send
        except Exception as exc:  # noqa: BLE001 - raised at the step's `yield`, where its handlers are
            value, send = exc, gen.throw


_DONE = object()


def _advance(send, value) -> tuple[Any, Any]:
    # StopIteration cannot cross a Future (asyncio turns it into a RuntimeError): return it as a value.
    try:
        return None, send(value)
    except StopIteration as stop:
        return _DONE, stop.value


async def run_async(gen: Steps[T]) -> T:
    send, value = gen.send, None
    while True:
        done, call = await asyncio.to_thread(_advance, send, value)
        if done is _DONE:
            return call
        try:
            value, send = await call.arun(), gen.send
        except Exception as exc:  # noqa: BLE001
            value, send = exc, gen.throw
