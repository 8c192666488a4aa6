"""Compiled programs: a DSPy module's tuned state (instructions, demos) saved as JSON with a header.

File layout (never pickle):
    {"agentic_iqa_program": {"module": "planner", "signature_version": "1", "optimizer": ..., "lm": ...,
                             "fixtures": {...sha256...}, "scores": {...}, "created": ISO-8601},
     "state": <dspy Module.dump_state()>}
A program is refused, with a message saying why, when it was compiled for another module or another
signature version, when its state does not fit the module, or when it carries LM settings of its own
(a program holds instructions and demos; the LM always comes from the configuration).
`agentic-iqa compile` (optimizers.runner) writes these files; `assess --program`, `programs:` in
pipeline.yaml and `VLMRoles.load_program` read them.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping


class ProgramError(ValueError):
    """A compiled program cannot be used here; the message says which file and why."""


def _signature_version() -> str:
    from signatures import SIGNATURE_VERSION

    return SIGNATURE_VERSION


def _signature_fingerprint() -> str:
    from signatures import signature_fingerprint

    return signature_fingerprint()


def save_program(module_obj: Any, module: str, path: str | Path, **metadata) -> Path:
    """Write `module_obj`'s state (instructions, demos) with a header; `metadata` joins the header."""
    path = Path(path)
    header = {
        "module": module,
        "signature_version": _signature_version(),
        # Informational: which exact field layout the demos were written for (the version is what is checked).
        "signature_fingerprint": _signature_fingerprint(),
        "created": datetime.now(timezone.utc).isoformat(),
        **metadata,
    }
    payload = {"agentic_iqa_program": header, "state": module_obj.dump_state()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)  # never leave a half-written program behind
    return path


def read_program(path: str | Path) -> tuple[dict, dict]:
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProgramError(f"compiled program {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"compiled program {path} is not a readable JSON file ({exc})") from None
    if not isinstance(payload, dict) or "agentic_iqa_program" not in payload or "state" not in payload:
        raise ProgramError(f"{path} is not an agentic-iqa compiled program (no 'agentic_iqa_program' header)")
    if not isinstance(payload["agentic_iqa_program"], dict):
        raise ProgramError(f"{path}: the 'agentic_iqa_program' header must be a JSON object")
    return payload["agentic_iqa_program"], payload["state"]


def load_program(modules: Mapping[str, Any], module: str, path: str | Path) -> dict:
    """Load the program at `path` into `modules[module]`; returns its header."""
    header, state = read_program(path)
    if module not in modules:
        raise ProgramError(f"unknown module {module!r} for program {path}; use one of {sorted(modules)}")
    if header.get("module") != module:
        raise ProgramError(f"{path} was compiled for the {header.get('module')!r} module, not {module!r}")
    if str(header.get("signature_version")) != _signature_version():
        raise ProgramError(
            f"{path} was compiled for signature version {header.get('signature_version')!r}, but this agentic-iqa "
            f"uses version {_signature_version()!r}; compile it again"
        )
    if not isinstance(state, dict):
        raise ProgramError(f"{path} has no module state (expected a JSON object under 'state')")
    carrying_lm = sorted(name for name, sub in state.items() if isinstance(sub, dict) and sub.get("lm"))
    if carrying_lm:
        # DSPy would rebuild an LM from these settings and use it instead of the configured one.
        raise ProgramError(
            f"{path} sets its own LM for {', '.join(carrying_lm)}; compiled programs may hold instructions and "
            "demos only (the LM comes from the configuration)"
        )
    try:
        modules[module].load_state(state)
    except Exception as exc:  # noqa: BLE001 - a mismatched state is a user-facing refusal, not a crash
        raise ProgramError(f"{path} does not fit the {module!r} module: {exc}") from None
    return header
