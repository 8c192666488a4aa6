"""Compiled programs: a DSPy module's tuned state (instructions, demos) saved as JSON with a header.

File layout (never pickle):
    {"agentic_iqa_program": {"module": "planner", "signature_version": "1", "optimizer": ..., "lm": ...,
                             "fixtures": {...sha256...}, "scores": {...}, "created": ISO-8601},
     "state": <dspy Module.dump_state()>}
A program is refused, with a message saying why, when it was compiled for another module or another
signature version, when its state does not fit the module, or when any predictor's state holds anything
but the allow-listed data (`PREDICTOR_KEYS`): instructions, field prefixes/descriptions and demos. DSPy's
`load_state` would set any other key as an attribute of the predictor (e.g. `"config": {"api_base": ...}`
would send the user's key and image to another server), and an `lm` would replace the configured LM; the
LM always comes from the configuration. Only regular files up to `MAX_PROGRAM_BYTES` are read.
`agentic-iqa compile` (optimizers.runner) writes these files; `assess --program`, `programs:` in
pipeline.yaml and `VLMRoles.load_program` read them.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping


#: What a compiled predictor's state may hold. `traces`/`train`/`lm` are written by DSPy's `dump_state`
#: and accepted only empty; everything else in a predictor's state is refused.
PREDICTOR_KEYS = frozenset({"demos", "signature", "traces", "train", "lm"})
SIGNATURE_KEYS = frozenset({"instructions", "fields"})
FIELD_KEYS = frozenset({"prefix", "description"})
MAX_PROGRAM_BYTES = 64 * 1024 * 1024
_MAX_DEPTH = 32


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
    state = module_obj.dump_state()
    for sub in state.values():  # an optimizer may leave its LM on a predictor: never save it (the allow-list)
        if isinstance(sub, dict):
            sub.update(lm=None, traces=[], train=[])
    from agentic_iqa.redact import redact_data

    # Demos are the model's own answers: a server that echoes the key would otherwise save it here.
    payload = redact_data({"agentic_iqa_program": header, "state": state})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)  # never leave a half-written program behind
    return path


def check_program_target(path: str | Path) -> Path:
    """`path` if a program can be written there (its folder is created if missing), else ProgramError:
    `agentic-iqa compile` checks its --out before spending any LM call on the compile."""
    path = Path(path)
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise ProgramError(f"cannot write the program to {path}: it exists and is not a regular file; "
                           "pass a .json file name or a folder (--out)")
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise ProgramError(f"cannot write the program to {path}: {folder} is not a folder; choose another --out")
            break
    if path.is_file() and path.stat().st_size:
        try:
            read_program(path)
        except ProgramError:
            raise ProgramError(f"cannot write the program to {path}: the file exists and is not a compiled program "
                               "(fixtures? an image?); choose another --out") from None
    probe = path.with_suffix(path.suffix + ".tmp")  # the name save_program writes first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ProgramError(f"cannot write the program to {path}: {exc.strerror or exc}; choose another --out") from None
    return path


def read_program(path: str | Path) -> tuple[dict, dict]:
    from iqa_tools.files import read_regular_file

    path = Path(path)
    try:  # a regular file only (a FIFO or /dev/zero is refused at once), at most MAX_PROGRAM_BYTES
        raw = read_regular_file(path, f"compiled program {path}", MAX_PROGRAM_BYTES, "a compiled program")
    except ValueError as exc:
        raise ProgramError(f"{exc}; pass a JSON file written by `agentic-iqa compile`") from None
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"compiled program {path} is not a readable JSON file ({exc})") from None
    if not isinstance(payload, dict) or "agentic_iqa_program" not in payload or "state" not in payload:
        raise ProgramError(f"{path} is not an agentic-iqa compiled program (no 'agentic_iqa_program' header)")
    if not isinstance(payload["agentic_iqa_program"], dict):
        raise ProgramError(f"{path}: the 'agentic_iqa_program' header must be a JSON object")
    return payload["agentic_iqa_program"], payload["state"]


def check_module(header: dict, module: str, path: str | Path) -> None:
    """ProgramError unless the program at `path` (its `header`) was compiled for `module`."""
    if header.get("module") != module:
        raise ProgramError(f"{path} was compiled for the {header.get('module')!r} module, not {module!r}")


def load_program(modules: Mapping[str, Any], module: str, path: str | Path) -> dict:
    """Load the program at `path` into `modules[module]`; returns its header."""
    header, state = read_program(path)
    if module not in modules:
        raise ProgramError(f"unknown module {module!r} for program {path}; use one of {sorted(modules)}")
    check_module(header, module, path)
    if str(header.get("signature_version")) != _signature_version():
        raise ProgramError(
            f"{path} was compiled for signature version {header.get('signature_version')!r}, but this agentic-iqa "
            f"uses version {_signature_version()!r}; compile it again"
        )
    if not isinstance(state, dict):
        raise ProgramError(f"{path} has no module state (expected a JSON object under 'state')")
    check_program_state(state, path, predictors=set(modules[module].dump_state()))
    try:
        modules[module].load_state(state)
    except Exception as exc:  # noqa: BLE001 - a mismatched state is a user-facing refusal, not a crash
        raise ProgramError(f"{path} does not fit the {module!r} module: {exc}") from None
    return header


def _refuse(path, where: str, why: str) -> ProgramError:
    return ProgramError(
        f"{path}: {where} {why}; compiled programs may hold instructions and demos only (the LM and its "
        "settings come from the configuration) - recompile it with `agentic-iqa compile`"
    )


def _is_data(value: Any, depth: int = 0) -> bool:
    """JSON data only (what json.loads gives), bounded in depth."""
    if depth > _MAX_DEPTH:
        return False
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_is_data(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_data(v, depth + 1) for k, v in value.items())
    return False


def check_program_state(state: dict, path, predictors: set[str]) -> None:
    """Refuse anything in a program's state outside the allow-list, naming the key and the file."""
    for name, sub in state.items():
        if name not in predictors:
            raise _refuse(path, f"predictor {name!r}", f"is not part of this module (expected {', '.join(sorted(predictors))})")
        if not isinstance(sub, dict):
            raise _refuse(path, f"predictor {name!r}", "is not a JSON object")
        for key, value in sub.items():
            where = f"key {name}.{key!r}"
            if key not in PREDICTOR_KEYS:
                raise _refuse(path, where, "is not allowed")
            if key in ("traces", "train", "lm") and value not in (None, []):
                raise _refuse(path, where, "must be empty" if key != "lm" else "sets its own LM")
            if key == "demos":
                if not isinstance(value, list) or not all(isinstance(d, dict) and _is_data(d) for d in value):
                    raise _refuse(path, where, "must be a list of JSON objects (demos are data)")
            if key == "signature":
                if not isinstance(value, dict):
                    raise _refuse(path, where, "must be a JSON object")
                for skey, sval in value.items():
                    if skey not in SIGNATURE_KEYS:
                        raise _refuse(path, f"key {name}.signature.{skey!r}", "is not allowed")
                if not isinstance(value.get("instructions", ""), str):
                    raise _refuse(path, f"key {name}.signature.'instructions'", "must be text")
                fields = value.get("fields", [])
                if not isinstance(fields, list):
                    raise _refuse(path, f"key {name}.signature.'fields'", "must be a list")
                for field in fields:
                    if not isinstance(field, dict):
                        raise _refuse(path, f"key {name}.signature.'fields'", "must hold JSON objects")
                    for fkey, fval in field.items():
                        if fkey not in FIELD_KEYS or not isinstance(fval, str):
                            raise _refuse(path, f"key {name}.signature.fields.{fkey!r}", "is not allowed (prefix and description text only)")
