"""Reading the answer letter's log-probabilities from an LM reply (DESIGN §5, Q-Align style).

Where DSPy 3.4 puts them: with `dspy.LM(..., logprobs=True, top_logprobs=5)`, every Predict result
carries `prediction.logprobs` = {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}, ...]}, ...]} — OpenAI's `choices[i].logprobs` shape, built by DSPy from the
provider's tokens — and the same dict sits in `lm.history[-1]["outputs"][0]["logprobs"]`. Without
`logprobs=True` on the LM, or from a provider that returns none, the key is absent.

The JSON reply is scanned token by token for the value of the `level` field; the top alternatives at
that token that spell a level letter give the five log-probabilities.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from signatures.vocabulary import QUALITY_LEVELS

__all__ = ["LEVEL_LETTERS", "MISSING_LOGPROB", "LevelReading", "token_logprobs", "read_level_logprobs", "level_logprobs"]

LEVEL_LETTERS = QUALITY_LEVELS
#: Log-probability given to a letter absent from the provider's top alternatives: exp(-100) ≈ 4e-44,
#: i.e. "below anything the provider ranked", finite so softmaxes stay well defined.
MISSING_LOGPROB = -100.0

# Characters that may share a token with the letter: quotes, spaces, JSON punctuation.
_STRIP = " \t\r\n\"'`.,:;)(}{"

Token = tuple[str, float, list[tuple[str, float]]]


@dataclass(frozen=True)
class LevelReading:
    """The five letters' log-probabilities and where they were read."""

    logprobs: dict[str, float]  # "A".."E" -> log-probability (MISSING_LOGPROB when not ranked)
    token: str  # the generated token that carries the letter, e.g. 'B' or '"B'
    token_index: int
    ranked: tuple[str, ...]  # letters the provider actually ranked at that position

    def note(self) -> str:
        missing = [x for x in LEVEL_LETTERS if x not in self.ranked]
        extra = f"; not ranked: {', '.join(missing)} (set to {MISSING_LOGPROB:g})" if missing else ""
        return f"log-probs of token #{self.token_index} {self.token!r}{extra}"


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _as_token(item: Any) -> Optional[Token]:
    if isinstance(item, tuple) and len(item) == 3:  # (token, logprob, [(alternative, logprob), ...])
        token, logprob, alts = item
        if not isinstance(token, str) or logprob is None:
            return None
        return token, float(logprob), [(str(t), float(lp)) for t, lp in alts or ()]
    token, logprob = _get(item, "token"), _get(item, "logprob")
    if not isinstance(token, str) or logprob is None:
        return None
    tops = _get(item, "top_logprobs")
    if tops is None:
        tops = _get(item, "top")  # dspy.lm15 TokenLogprob
    alts = []
    for top in tops or ():
        t, lp = _get(top, "token"), _get(top, "logprob")
        if isinstance(t, str) and lp is not None:
            alts.append((t, float(lp)))
    return token, float(logprob), alts


def token_logprobs(source: Any) -> Optional[list[Token]]:
    """[(token, logprob, [(alternative, logprob), ...]), ...] from whatever carries them, or None.

    Accepts a dspy.Prediction, a DSPy output dict ({"text", "logprobs"}), an OpenAI-shaped logprobs
    dict ({"content": [...]}), a list of token dicts or of (token, logprob, alternatives) tuples, or a
    dspy.lm15 Response.
    """
    if source is None:
        return None
    # dspy.Prediction keeps fields in a store; .get avoids AttributeError when the key is absent.
    if hasattr(source, "_store") and hasattr(source, "get"):
        return token_logprobs(source.get("logprobs"))
    if isinstance(source, Mapping):
        if "content" in source:
            return token_logprobs(source["content"])
        if "logprobs" in source:
            return token_logprobs(source["logprobs"])
        return None
    if not isinstance(source, (str, bytes)) and isinstance(source, Sequence):
        tokens = [t for t in (_as_token(item) for item in source) if t is not None]
        return tokens or None
    if hasattr(source, "logprobs"):  # lm15 Response: a tuple of TokenLogprob, or None
        return token_logprobs(source.logprobs)
    return None


def _letter(token: str) -> Optional[str]:
    core = token.strip(_STRIP)
    if len(core) == 1 and core.upper() in LEVEL_LETTERS:
        return core.upper()
    return None


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def read_level_logprobs(source: Any, *, field: str = "level") -> Optional[LevelReading]:
    """The log-probabilities of A–E at the token holding `field`'s value in a JSON reply, or None.

    None when the provider returned no log-probs, when `"<field>": "<letter>"` is not in the tokens,
    or when that position has no ranked alternatives (only the chosen token would make the chosen
    letter look certain). Lower-case letters count as their upper-case level.
    """
    tokens = token_logprobs(source)
    if not tokens:
        return None
    text = "".join(t for t, _, _ in tokens)
    match = re.search(r'"%s"\s*:\s*"?\s*([A-Za-z])(?![A-Za-z])' % re.escape(field), text)
    if match is None:
        return None
    pos, start = match.start(1), 0
    for index, (token, logprob, alts) in enumerate(tokens):
        end = start + len(token)
        if start <= pos < end:
            break
        start = end
    else:  # pragma: no cover - the regex matched inside the joined text, so some token covers it
        return None
    if not alts or _letter(token) is None:
        return None
    candidates: dict[str, float] = {t: lp for t, lp in alts}
    candidates.setdefault(token, logprob)  # providers differ on whether the chosen token is listed
    by_letter: dict[str, list[float]] = {}
    for t, lp in candidates.items():
        letter = _letter(t)
        if letter is not None:
            by_letter.setdefault(letter, []).append(lp)
    logprobs = {x: _logsumexp(by_letter[x]) if x in by_letter else MISSING_LOGPROB for x in LEVEL_LETTERS}
    return LevelReading(logprobs=logprobs, token=token, token_index=index, ranked=tuple(x for x in LEVEL_LETTERS if x in by_letter))


def level_logprobs(source: Any, *, field: str = "level") -> Optional[dict[str, float]]:
    """Just the {"A": logprob, ..., "E": logprob} of read_level_logprobs, or None."""
    reading = read_level_logprobs(source, field=field)
    return None if reading is None else reading.logprobs
