"""`--lm demo`: a scripted stand-in LM so `agentic-iqa compile` can be tried offline. NOT A MODEL.

The "fixture-echo" demo LM answers every agent request by looking the input up in the fixtures it
was built from and returning that fixture's label — or, with a scripted probability, a plausible
wrong answer. That probability is what the optimizers get to improve, and it is set by a rule, not
learned:

    P(correct) = min(0.95, 0.45 + 0.10 × min(number of demos in the prompt, 4)
                           + 0.10 if the instructions contain DEMO_REWARDED_PHRASE)

Whether a given input is answered correctly is a fixed function of the input (a hash compared with
P), so adding demos only ever turns wrong answers right: before/after figures are reproducible.
Requests from the optimizers themselves (MIPROv2's and GEPA's instruction proposals) get the
current instruction with DEMO_REWARDED_PHRASE appended.

So the scores it produces show the compile workflow working (few-shot demos and an adopted
instruction measurably change the metric); they say nothing about how a real VLM would do.
Inputs it has no fixture for get a valid but uninformed answer whose reasoning says so.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from typing import Any, Iterable, Optional

import dspy

from signatures.vocabulary import SEVERITIES

DEMO_MODEL = "demo/fixture-echo"
DEMO_REWARDED_PHRASE = "Before answering, check every field against the rules and the worked examples above."
BASE_P, PER_DEMO_P, MAX_DEMOS_COUNTED, PHRASE_P, MAX_P = 0.45, 0.10, 4, 0.10, 0.95

# First output field of each agent signature -> signature short name.
_PART_BY_FIELD = {
    "planner_output": "plan",
    "distortion_set": "detect",
    "distortion_analysis": "analyze",
    "selected_tools": "select",
    "final_answer": "explain",
    "level": "score",
}
_OUTPUTS = re.compile(r"Your output fields are:\s*(.*?)(?:\n\n|All interactions|\Z)", re.S)
_FIELD = re.compile(r"^\d+\. `(\w+)`", re.M)
_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n?")
_OPTION = re.compile(r"(?:^|\s)([A-F])[.)]\s")
# Categories a detector plausibly confuses (used for scripted wrong answers).
_CONFUSED = {
    "Blurs": "Sharpness", "Sharpness": "Blurs", "Noise": "Compression", "Compression": "Noise",
    "Brightness change": "Contrast", "Contrast": "Brightness change", "Color distortions": "Contrast",
}
_SEVERITIES = SEVERITIES


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _image_sha(value: Any) -> Optional[str]:
    url = getattr(value, "url", None)
    if isinstance(url, str) and url.startswith("data:") and "," in url:
        return hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()
    return None


def _key(part: str, fields: dict[str, Any], image_sha: Optional[str]) -> Optional[str]:
    if part == "plan":
        return _canon([fields.get("query"), fields.get("reference_mode")])
    if part == "detect":
        return _canon([image_sha, fields.get("query")])
    if part == "analyze":
        return _canon([image_sha, fields.get("distortion_set")])
    if part == "select":
        return _canon([fields.get("distortion_set"), fields.get("reference_mode")])
    if part in ("explain", "score"):
        return _canon([image_sha, fields.get("query")])
    return None


def _unit(*parts: Any) -> float:
    """A fixed number in [0, 1) for these inputs (the scripted 'luck' of one answer)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FixtureEchoEngine:
    """The dspy.LM engine (complete(Request) -> Response) behind the demo LM."""

    def __init__(self, examples: Iterable[Any] = (), tool_modes: Optional[dict[str, str]] = None,
                 tool_strengths: Optional[dict[str, list[str]]] = None, seed: int = 0):
        self.seed = seed
        self.tool_modes = dict(tool_modes or {})
        self.tool_strengths = dict(tool_strengths or {})
        self.index: dict[tuple[str, str], Any] = {}
        self.calls = 0
        self._lock = threading.Lock()
        for example in examples:
            self.add(example)

    # ── index ───────────────────────────────────────────────────────────────────────────────────

    def add(self, example: Any) -> None:
        part = example.part
        fields = {k: example.get(k) for k in ("query", "reference_mode", "distortion_set")}
        key = _key(part, fields, _image_sha(example.get("image")))
        if key is not None:
            self.index[(part, key)] = example

    # ── answering ───────────────────────────────────────────────────────────────────────────────

    def complete(self, request):
        from dspy.lm15 import response_from_openai_chat

        with self._lock:
            self.calls += 1
        system = _text(request.system)
        outputs = tuple(_FIELD.findall(m.group(1))) if (m := _OUTPUTS.search(system)) else ()
        last_user = next((m for m in reversed(request.messages) if m.role == "user"), None)
        parts = last_user.parts if last_user is not None else ()
        user_text = "".join(getattr(p, "text", "") or "" for p in parts)
        images = [p for p in parts if getattr(p, "type", None) == "image"]
        image_sha = hashlib.sha256(images[0].bytes).hexdigest() if images and images[0].bytes else None
        n_demos = sum(1 for m in request.messages if m.role == "assistant")
        fields = _fields(user_text)
        part = _PART_BY_FIELD.get(outputs[0]) if outputs else None
        if part is not None:
            text = json.dumps(self._answer(part, fields, image_sha, n_demos, system), ensure_ascii=False)
        else:
            text = self._proposal(outputs, fields, chat="[[ ## completed ## ]]" in system)
        body = {
            "id": "demo", "object": "chat.completion", "created": 0, "model": request.model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        return response_from_openai_chat(body, model=request.model)

    def p_correct(self, n_demos: int, system: str) -> float:
        p = BASE_P + PER_DEMO_P * min(n_demos, MAX_DEMOS_COUNTED) + (PHRASE_P if DEMO_REWARDED_PHRASE in system else 0.0)
        return min(MAX_P, p)

    def _answer(self, part: str, fields: dict[str, Any], image_sha: Optional[str], n_demos: int, system: str) -> dict:
        key = _key(part, fields, image_sha)
        example = self.index.get((part, key))
        if example is None:
            return self._uninformed(part, fields)
        gold = _gold(part, example)
        luck = _unit(self.seed, part, key)
        if luck < self.p_correct(n_demos, system):
            return gold
        return self._wrong(part, gold, example, _unit(self.seed, "how", part, key))

    def _wrong(self, part: str, gold: dict, example: Any, luck: float) -> dict:
        """A valid answer with the kind of mistake a VLM makes on this subtask."""
        out = json.loads(json.dumps(gold))
        if part == "plan":
            plan = out["planner_output"]
            if luck < 0.5 and plan["query_type"] == "IQA":
                # The classic slip: run the full tool pipeline whatever the query names.
                plan["plan"].update(tool_selection=True, tool_execution=True, distortion_detection=True)
            if plan == gold["planner_output"]:  # that slip changes nothing for this query: misread its type
                plan["query_type"] = "Other" if plan["query_type"] == "IQA" else "IQA"
                plan["plan"]["distortion_analysis"] = plan["query_type"] == "IQA"
        elif part == "detect":
            ds = out["distortion_set"]
            for obj, cats in ds.items():
                if luck < 0.5 or not cats:
                    ds[obj] = [_CONFUSED.get(c, "Noise") for c in cats] or ["Noise"]
                else:
                    ds[obj] = cats + [c for c in (_CONFUSED.get(cats[0]),) if c and c not in cats]
        elif part == "analyze":
            step = 1 if luck < 0.6 else 2
            for items in out["distortion_analysis"].values():
                for item in items:
                    i = _SEVERITIES.index(item["severity"])
                    item["severity"] = _SEVERITIES[i - step if i - step >= 0 else i + step]
        elif part == "select":
            fr = example.get("reference_mode") == "Full-Reference"
            for obj, by in out["selected_tools"].items():
                for dist in by:
                    ok = set(example.get("acceptable", {}).get(obj, {}).get(dist, []))
                    # With a reference: an NR tool (wrong kind). Without: an NR tool with no strength here.
                    pool = [t for t, m in self.tool_modes.items() if m == "NR" and t not in ok
                            and (fr or dist not in self.tool_strengths.get(t, []))]
                    if pool:
                        by[dist] = pool[int(luck * len(pool))]
        elif part == "explain":
            letters = _OPTION.findall(example.get("query") or "")
            if letters and out["final_answer"] in letters:
                others = [x for x in letters if x != out["final_answer"]]
                out["final_answer"] = others[int(luck * len(others))]
            else:
                out["final_answer"] = "I cannot tell from this image."
        elif part == "score":
            order = "EDCBA"
            i = order.index(out["level"])
            step = 1 if luck < 0.7 else 2
            out["level"] = order[i + step] if i + step < 5 else order[i - step]
        return out

    def _uninformed(self, part: str, fields: dict[str, Any]) -> dict:
        note = "demo LM: this input is not in the fixtures it was built from, so this answer is uninformed"
        if part == "plan":
            from agentic_iqa.agents.planner_rules import rule_decision

            decision = rule_decision(str(fields.get("query") or ""), fields.get("available_tools") or self.tool_modes)
            return {"planner_output": decision.model_dump(mode="json")}
        if part == "detect":
            scope = fields.get("query_scope") or ["Global"]
            return {"distortion_set": {obj: [] for obj in scope}}
        if part == "analyze":
            ds = fields.get("distortion_set") or {}
            return {"distortion_analysis": {obj: [{"type": t, "severity": "slight", "explanation": note} for t in ts]
                                            for obj, ts in ds.items()}}
        if part == "select":
            fr = fields.get("reference_mode") == "Full-Reference"
            ds = fields.get("distortion_set") or {}
            mode = "FR" if fr else "NR"
            kind = [t for t, m in self.tool_modes.items() if m == mode] or list(self.tool_modes)
            pick = lambda d: next((t for t in kind if d in self.tool_strengths.get(t, [])), kind[0] if kind else "PIQE")  # noqa: E731
            return {"selected_tools": {obj: {d: pick(d) for d in ts} for obj, ts in ds.items()}}
        reply = {"quality_reasoning": note, "need_replan": False, "replan_reason": None}
        if part == "explain":
            letters = _OPTION.findall(str(fields.get("query") or ""))
            return {"final_answer": letters[0] if letters else "I cannot tell.", **reply}
        return {"level": "C", **reply}

    def _proposal(self, outputs: tuple[str, ...], fields: dict[str, Any], chat: bool) -> str:
        """Answers to the optimizers' own requests (instruction proposals, dataset summaries)."""
        current = next((str(fields[k]) for k in ("current_instruction", "basic_instruction", "instruction")
                        if fields.get(k)), "")
        proposal = current if DEMO_REWARDED_PHRASE in current else f"{current.rstrip()}\n\n{DEMO_REWARDED_PHRASE}".strip()
        values = {f: proposal if "instruction" in f else f"(demo LM placeholder for {f})" for f in outputs or ("answer",)}
        if not chat:
            return json.dumps(values)
        return "".join(f"[[ ## {f} ## ]]\n{v}\n\n" for f, v in values.items()) + "[[ ## completed ## ]]"


def _text(parts: Any) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    return "".join(getattr(p, "text", "") or "" for p in parts)


def _fields(user_text: str) -> dict[str, Any]:
    """The input fields of a DSPy-formatted user message ([[ ## name ## ]] sections), JSON-decoded where possible."""
    pieces = _SECTION.split(user_text)
    out: dict[str, Any] = {}
    for name, value in zip(pieces[1::2], pieces[2::2]):
        value = re.split(r"\n\n(?:Respond with|\[\[ ## )", value)[0].strip()
        try:
            out[name] = json.loads(value) if value[:1] in "[{" else value
        except json.JSONDecodeError:
            out[name] = value
    return out


def _gold(part: str, example: Any) -> dict:
    from optimizers.examples import output_fields

    out = {}
    for name in output_fields(part):
        value = example.get(name)
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        out[name] = value
    return json.loads(json.dumps(out, default=str))


def demo_lm(examples: Iterable[Any], *, tool_modes: Optional[dict[str, str]] = None,
            tool_strengths: Optional[dict[str, list[str]]] = None, engine: Optional[FixtureEchoEngine] = None) -> dspy.LM:
    """A demo LM answering from `examples` (dspy.Examples with a `part`); see the module docstring.

    Pass an existing `engine` to get a second LM instance sharing its fixtures (e.g. a separate
    "proposal" LM whose calls are counted apart from the task LM's).
    """
    engine = engine or FixtureEchoEngine(examples, tool_modes, tool_strengths)
    return dspy.LM(DEMO_MODEL, engine=engine, cache=False, num_retries=0)
