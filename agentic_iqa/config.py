"""Configuration: `configs/model_backends.yaml` (an LM per role) and `configs/pipeline.yaml`.

Which config folder: `--config` (the `config_dir` argument) > `AGENTIC_IQA_CONFIG` > the user config
dir (`user_config_dir()`, when it holds our files) > none (package defaults). The current folder is never
searched. Precedence of values, lowest to highest: the defaults below (the shipped YAML files repeat them,
and a test keeps the two equal) < YAML files in the config folder < environment variables < explicit
arguments (CLI flags, Python API keywords). API keys are never read from files.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from iqa_tools.images import DEFAULT_MAX_PIXELS

ROLES = ("planner", "executor", "summarizer")
#: The modules a compiled program can tune (the keys of `programs:`): agents.modules.MODULE_NAMES, repeated
#: here because config sits below the agents (a test keeps the two equal).
PROGRAM_MODULES = ("planner", "detect", "analyze", "select", "summarize")
CONFIG_FILES = ("model_backends.yaml", "pipeline.yaml")


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the file and key."""


class LMSetupError(ConfigError):
    """The configured LM cannot be used as set up: no API key, a refused key, billing, an unknown model.

    Unlike an unreachable or misbehaving LM, retrying or answering offline would only hide it."""


# allow_inf_nan=False: YAML's .inf/.nan passed `gt=0` and failed later, naming neither file nor key.
class RoleLM(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Optional[str] = None
    api_base: Optional[str] = None
    api_key_env: Optional[str] = None
    temperature: float = 0.0
    max_tokens: int = 2048
    logprobs: bool = False
    num_retries: int = Field(3, ge=0)  # HTTP retries (429, 5xx, timeouts) within call_budget
    timeout: float = Field(120, gt=0)  # seconds without a byte from the server (one request)
    # Wall-clock seconds one LM call may take, every retry and every wait included: the call fails
    # (LMTimeoutError: the offline analyst takes over) rather than run past it.
    call_budget: float = Field(300, gt=0)
    max_retry_after: float = Field(30, ge=0)  # a server's Retry-After is honoured up to this many seconds
    max_reply_bytes: int = Field(4 * 1024 * 1024, gt=0)  # a longer reply is refused before it is parsed


class ModelBackends(BaseModel):
    model_config = ConfigDict(extra="forbid")

    planner: RoleLM = RoleLM()
    executor: RoleLM = RoleLM()
    summarizer: RoleLM = RoleLM(logprobs=True)

    def role(self, name: str) -> RoleLM:
        return getattr(self, name)

    @property
    def any_model(self) -> bool:
        return any(self.role(r).model for r in ROLES)


class FusionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    eta: float = Field(1.0, gt=0)
    prob_mode: Literal["logits", "classification", "uniform"] = "logits"


class CacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    dir: Optional[Path] = None
    max_mb: float = Field(256, gt=0)


DEVICE_FORM = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def _existing_folder(v: Optional[Path]) -> Optional[Path]:
    """The weights folder, `~` expanded, must exist: it is only read, so a typo would pass silently and every
    weight-based tool would then report its file missing (as a missing --config folder is an error)."""
    if v is None:
        return None
    v = Path(v).expanduser()
    if not v.is_dir():
        what = "is a file, not a folder" if v.exists() else "no such folder"
        raise ValueError(f"{what} ({v}); give the folder holding the tools' pyiqa checkpoints, or leave it unset")
    return v


class ToolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = "auto"
    extra_tables: list[Path] = []
    weights_dir: Optional[Path] = None
    offline: Optional[bool] = None  # None: downloads allowed; True: a tool whose files are missing fails at once

    _weights_dir = field_validator("weights_dir")(_existing_folder)

    @field_validator("device")
    @classmethod
    def _device_form(cls, v: str) -> str:
        v = v.strip().lower()
        if not DEVICE_FORM.match(v):
            raise ValueError(f"unknown device {v!r}; use auto, cpu, cuda, cuda:N or mps")
        return v


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["auto", "vlm", "offline"] = "auto"
    max_replan: int = Field(2, ge=0)
    max_retries: int = Field(3, ge=0)
    fusion: FusionSettings = FusionSettings()
    vlm_image_max_side: int = Field(2048, ge=64)
    # How images travel to the VLM: auto | original | jpeg[:Q] | side:N | jpeg:Q,side:N (signatures/image.py).
    image_transport: str = "auto"
    max_image_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0)  # the decompression-bomb guard iqa_tools applies
    max_query_chars: int = Field(2000, gt=0)
    lm_history: bool = False  # keep DSPy's per-call history and trace (dspy.inspect_history); they hold every image
    cache: CacheSettings = CacheSettings()
    tools: ToolSettings = ToolSettings()
    programs: dict[str, Path] = {}

    @field_validator("programs")
    @classmethod
    def _program_modules(cls, v: dict[str, Path]) -> dict[str, Path]:
        # A misspelt key was accepted, and without a model never looked at: refused, model or not.
        import difflib

        for name in v:
            if name not in PROGRAM_MODULES:
                close = difflib.get_close_matches(name, PROGRAM_MODULES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown module {name!r}{hint}; the keys are module names: {', '.join(PROGRAM_MODULES)}")
        return v

    @field_validator("image_transport")
    @classmethod
    def _transport_form(cls, v: str) -> str:
        kind, quality, side = image_transport_parts(v)
        parts = [] if kind == "auto" and side else [kind if quality is None else f"{kind}:{quality}"]
        return ",".join(parts + ([f"side:{side}"] if side else []))


def image_transport_parts(text: str) -> tuple[str, Optional[int], Optional[int]]:
    """`image_transport` as (auto | original | jpeg, JPEG quality or None, longest side or None).

    "auto", "original", "jpeg" (quality 90), "jpeg:80", "side:1024" (auto encoding at most 1024 px),
    "jpeg:85,side:1024". A ValueError names the accepted forms."""
    kind, quality, side = "auto", None, None
    forms = "auto, original, jpeg, jpeg:Q (Q 1-100), side:N (N >= 64 pixels) or jpeg:Q,side:N"
    seen = set()
    for part in (p.strip().lower() for p in str(text).split(",")):
        name, _, value = part.partition(":")
        if name in seen or name not in ("auto", "original", "jpeg", "side") or (value and name in ("auto", "original")):
            raise ValueError(f"image_transport {text!r} is not one of: {forms}")
        seen.add(name)
        if name == "side":
            if not value.isdigit() or int(value) < 64:
                raise ValueError(f"image_transport {text!r}: side needs a whole number of pixels >= 64 (side:1024)")
            side = int(value)
        elif name == "jpeg" and value:
            if not value.isdigit() or not 1 <= int(value) <= 100:
                raise ValueError(f"image_transport {text!r}: the JPEG quality is a whole number 1-100 (jpeg:90)")
            kind, quality = "jpeg", int(value)
        else:
            kind = name
    if len(seen & {"auto", "original", "jpeg"}) > 1 or ("original" in seen and side):
        raise ValueError(f"image_transport {text!r} combines forms that contradict each other; use one of: {forms}")
    return kind, quality, side


def uses_model(pipeline: PipelineConfig, backends: ModelBackends) -> bool:
    """A model answers (the offline analyst only as its fallback): a model is configured and the backend
    is not forced offline."""
    return pipeline.backend != "offline" and backends.any_model


class Settings(BaseModel):
    """Everything one assessment needs to know about how to run. Built by `load_settings()`, the only
    place that reads the environment; `build_registry()` hands the tool settings to iqa_tools."""

    backends: ModelBackends = ModelBackends()
    pipeline: PipelineConfig = PipelineConfig()
    config_dir: Optional[Path] = None
    config_files: list[Path] = []  # the YAML files actually read (named by --verbose and the result's notes)
    sources: dict[str, str] = {}  # setting -> where its value came from, for error messages

    @property
    def uses_model(self) -> bool:
        """A model answers (the offline analyst only as its fallback): see `uses_model()`."""
        return uses_model(self.pipeline, self.backends)

    def build_registry(self, *, extra_tables: Iterable[Path] = (), device: Optional[str] = None,
                       weights_dir: Optional[Path] = None, cache: bool = True):
        """The tool registry for these settings (CLI flags passed here win). A device that does not
        exist on this machine is a configuration error naming where it was set."""
        from iqa_tools import ToolCache, ToolRegistry

        p = self.pipeline
        dev = device or p.tools.device
        _check_device(dev, "--device" if device else self.sources.get("tools.device", "tools.device"))
        use_cache = cache and p.cache.enabled
        return ToolRegistry(
            table_paths=[*p.tools.extra_tables, *extra_tables],
            device=dev,
            cache=ToolCache(p.cache.dir, max_mb=p.cache.max_mb) if use_cache else False,
            weights_dir=weights_dir or p.tools.weights_dir,
            offline=bool(p.tools.offline),
            max_pixels=p.max_image_pixels,
        )


def _check_device(device: str, source: str) -> None:
    """cuda / cuda:N / mps must exist here (torch is imported only for those)."""
    if not DEVICE_FORM.match(device):
        raise ConfigError(f"{source}: unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda"):
        from iqa_tools import backend

        torch = backend.torch()

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ConfigError(f"{source}: device {device!r} does not exist here ({have}); use cpu or auto")
    elif device == "mps":
        from iqa_tools import backend

        torch = backend.torch()

        mps = getattr(torch.backends, "mps", None)
        if not (mps is not None and mps.is_available()):
            raise ConfigError(f"{source}: device 'mps' is not available here; use cpu or auto")


def user_config_dir() -> Path:
    """The per-user config folder (platformdirs: ~/.config/agentic-iqa on Linux, honouring XDG_CONFIG_HOME)."""
    from platformdirs import user_config_dir as _user_config_dir

    return Path(_user_config_dir("agentic-iqa", appauthor=False))


def default_config_dir(env: Optional["EnvSettings"] = None) -> Optional[Path]:
    """Where the configuration comes from when no folder is passed, in this order:
    `AGENTIC_IQA_CONFIG`, else the user config dir when it holds our files, else none (the package
    defaults). The current folder is never searched: a `configs/` folder wherever the user happens
    to stand (e.g. a downloaded repository) could otherwise load programs or point the LM elsewhere."""
    folder = (env or env_settings()).CONFIG
    if folder:
        return folder
    user = user_config_dir()
    return user if any((user / name).is_file() for name in CONFIG_FILES) else None


MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: the bundled config files are a few KB


def _read_yaml(path: Path) -> dict:
    """A config file's settings: a regular file of at most MAX_CONFIG_BYTES, UTF-8, a YAML mapping."""
    from iqa_tools.files import read_regular_file

    try:
        raw = read_regular_file(path, f"config file {path}", MAX_CONFIG_BYTES, "a config file")
        data = yaml.safe_load(raw.decode("utf-8"))
    except ValueError as exc:  # not a regular file, too big, unreadable (read_regular_file's one line)
        if isinstance(exc, UnicodeDecodeError):
            raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        raise ConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        from iqa_tools.files import yaml_error_line

        raise ConfigError(f"config file {path}: not valid YAML ({yaml_error_line(exc)}); fix the YAML there (indentation, quotes, brackets)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def _validate(model: type[BaseModel], data: dict, path: Path):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: `{where}`: {_msg(first)}") from None


KEY_NAMES = {"api_key", "key", "openai_api_key", "apikey", "token", "secret"}


def _env_field(setting: str, **kw):
    return Field(None, description=setting, **kw)


class DebugSettings(BaseSettings):
    """AGENTIC_IQA_DEBUG alone: the CLI's last-resort error path reads it even when another variable is bad."""

    model_config = SettingsConfigDict(env_prefix="AGENTIC_IQA_", env_ignore_empty=True, extra="ignore",
                                      case_sensitive=True)

    DEBUG: bool = Field(False, description="the CLI prints the (redacted) traceback of an unforeseen error")


class EnvSettings(DebugSettings):
    """The environment variables agentic-iqa reads (pydantic-settings; read here and nowhere else).

    Each field is `AGENTIC_IQA_<NAME>`; its description names the setting it sets. Empty means unset.
    README's environment table lists them (a test keeps the two equal)."""

    CONFIG: Optional[Path] = _env_field("the config folder")
    LM: Optional[str] = _env_field("backends.<role>.model")
    API_BASE: Optional[str] = _env_field("backends.<role>.api_base")
    BACKEND: Optional[Literal["auto", "vlm", "offline"]] = _env_field("pipeline.backend")
    DEVICE: Optional[str] = _env_field("pipeline.tools.device")
    CACHE_DIR: Optional[Path] = _env_field("pipeline.cache.dir")
    PROB_MODE: Optional[Literal["logits", "classification", "uniform"]] = _env_field("pipeline.fusion.prob_mode")
    MAX_PIXELS: Optional[PositiveInt] = _env_field("pipeline.max_image_pixels")
    TOOL_FILES: Optional[str] = _env_field("pipeline.tools.extra_tables (os.pathsep-separated, added)")
    WEIGHTS_DIR: Optional[Path] = _env_field("pipeline.tools.weights_dir")
    OFFLINE: Optional[bool] = _env_field("pipeline.tools.offline (1/0; else HF_HUB_OFFLINE=1 means offline)")
    # Read where they act (iqa_tools.backend, below this package), checked here so a bad value is an error.
    TORCH_THREADS: Optional[PositiveInt] = _env_field("torch intra-op threads for tool runs (iqa_tools.backend)")
    MALLOC_TUNING: Optional[bool] = _env_field("0: leave glibc's malloc thresholds alone (iqa_tools.backend)")
    # Hugging Face's own switch, honoured so that one variable makes every download refuse.
    HF_HUB_OFFLINE: Optional[bool] = Field(None, validation_alias="HF_HUB_OFFLINE", exclude=True)

    _weights_dir = field_validator("WEIGHTS_DIR")(_existing_folder)


class RayEnvSettings(BaseSettings):
    """The cluster sizes of `--engine ray` runs (`assess --actors` etc. override them)."""

    model_config = SettingsConfigDict(env_prefix="AGENTIC_IQA_RAY_", env_ignore_empty=True, extra="ignore",
                                      case_sensitive=True)

    ACTORS: Optional[int] = Field(None, ge=1, description="assess --actors (Ray worker actors)")
    BATCH_SIZE: Optional[int] = Field(None, ge=1, description="assess --ray-batch-size")
    GPUS_PER_WORKER: Optional[float] = Field(None, ge=0, allow_inf_nan=False, description="assess --gpus-per-worker")
    LM_MAX_IN_FLIGHT: Optional[int] = Field(None, ge=1, description="assess --lm-max-in-flight")


def ray_env_settings(skip: Iterable[str] = ()) -> RayEnvSettings:
    """The AGENTIC_IQA_RAY_* variables, validated; those named in `skip` (overridden by a flag) are not read."""
    try:
        return RayEnvSettings(**{name: None for name in skip})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        raise ConfigError(f"AGENTIC_IQA_RAY_{field}={first.get('input')!r}: {_msg(first)}; fix or unset it") from None


#: How a bad value should look, by variable, for the one-line error.
_ENV_HINTS = {
    "MAX_PIXELS": "expected a positive whole number of pixels (e.g. 100000000); unset it for the default",
    "OFFLINE": "expected 1/0 (true/false, yes/no, on/off)",
    "TORCH_THREADS": "expected a positive whole number of threads; unset it for the default (1)",
    "MALLOC_TUNING": "expected 1/0 (true/false, yes/no, on/off)",
    "DEBUG": "expected 1/0 (true/false, yes/no, on/off)",
    "HF_HUB_OFFLINE": "expected 1/0 (true/false, yes/no, on/off)",
}


def env_var_name(field: str) -> str:
    return field if field == "HF_HUB_OFFLINE" else f"AGENTIC_IQA_{field}"


def env_settings() -> EnvSettings:
    """The environment, validated; a bad value is a ConfigError naming the variable."""
    try:
        return EnvSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        hint = _ENV_HINTS.get(field) or _msg(first)
        if "DEVICE" in field:
            hint = "unknown device; use auto, cpu, cuda, cuda:N or mps"
        raise ConfigError(f"{env_var_name(field)}={first.get('input')!r}: {hint}") from None


def env_vars() -> dict[str, str]:
    """{variable: the setting it sets}, for the README's table."""
    out = {env_var_name(name): f.description or "" for name, f in EnvSettings.model_fields.items()
           if name != "HF_HUB_OFFLINE"}
    return out | {f"AGENTIC_IQA_RAY_{name}": f.description or "" for name, f in RayEnvSettings.model_fields.items()}


#: AGENTIC_IQA_* variables read outside the package (benchmarks/fit_corpus.py: the corpus cache folder).
_OTHER_VARS = ("AGENTIC_IQA_CORPUS",)


def unknown_env_vars() -> list[tuple[str, Optional[str]]]:
    """AGENTIC_IQA_* variables set in the environment that nothing reads (a misspelling does nothing
    otherwise), each with the closest known name or None."""
    import difflib

    known = [*env_vars(), *_OTHER_VARS]
    return [(name, next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.8)), None))
            for name in sorted(os.environ) if name.startswith("AGENTIC_IQA_") and name not in known]


def debug_enabled() -> bool:
    """AGENTIC_IQA_DEBUG, for the CLI's last-resort error path (a bad value means off)."""
    try:
        return DebugSettings().DEBUG
    except ValidationError:
        return False


def _env_overrides(env: EnvSettings, backends: ModelBackends, pipeline: PipelineConfig, sources: dict[str, str]) -> None:
    for r in ROLES:
        if env.LM:
            backends.role(r).model = env.LM
        if env.API_BASE:
            backends.role(r).api_base = env.API_BASE
    if env.BACKEND:
        pipeline.backend = env.BACKEND
    if env.DEVICE:
        pipeline.tools.device = env.DEVICE.strip().lower()
        sources["tools.device"] = "AGENTIC_IQA_DEVICE"
        if not DEVICE_FORM.match(pipeline.tools.device):
            raise ConfigError(f"AGENTIC_IQA_DEVICE={env.DEVICE!r}: unknown device; use auto, cpu, cuda, cuda:N or mps")
    if env.CACHE_DIR:
        pipeline.cache.dir = env.CACHE_DIR.expanduser()
    if env.PROB_MODE:
        pipeline.fusion.prob_mode = env.PROB_MODE
    if env.MAX_PIXELS:
        pipeline.max_image_pixels = env.MAX_PIXELS
    if env.TOOL_FILES:
        extra = [Path(p) for p in env.TOOL_FILES.split(os.pathsep) if p.strip()]
        pipeline.tools.extra_tables = [*pipeline.tools.extra_tables, *extra]
    if env.WEIGHTS_DIR:
        pipeline.tools.weights_dir = env.WEIGHTS_DIR
    if env.OFFLINE is not None:
        pipeline.tools.offline = env.OFFLINE
    elif pipeline.tools.offline is None and env.HF_HUB_OFFLINE:
        pipeline.tools.offline = True


def checked_base_url(url: str, where: str) -> str:
    """`url` (stripped) when it is an http(s) URL with a host; otherwise a ConfigError naming `where` it was set
    (a malformed base URL makes every call fail and the run fall back silently). Checked when the settings are
    read, model or not: a typo must not wait for the day a model is set. A password in it is masked wherever
    the URL is quoted."""
    from urllib.parse import urlsplit

    from agentic_iqa.redact import redact, register_secret

    # Quoted without what follows '?' or '#': a query may carry a key (?key=…, a signed URL's sig=…).
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    shown = redact(url if cut < 0 else url[:cut] + url[cut] + "…")
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} {shown!r} is not a valid http(s) URL (scheme, host, port); "
                          "write it like http://localhost:8000/v1")
    register_secret(parts.password)
    if parts.query or parts.fragment or cut >= 0:
        # The client appends /chat/completions to the base: '?api-version=…' ended up inside the path.
        raise ConfigError(f"{where} {shown!r} has a query string or fragment ('?…' / '#…'), which would break every "
                          "request (the request path is appended after it); give the base URL alone, e.g. "
                          "http://localhost:8000/v1. For Azure OpenAI use LiteLLM's azure/ provider "
                          "(--lm azure/DEPLOYMENT, the resource URL as the base) and set the API version with "
                          "AZURE_API_VERSION; a key goes in the environment (OPENAI_API_KEY, AZURE_API_KEY or "
                          "api_key_env), never in the URL")
    return url.strip()


def _check_unused_programs(programs: dict[str, Path], cdir: Optional[Path], data: dict, overrides: dict) -> None:
    """With no model, programs are never loaded; their files are still checked (as `--program`'s are) so a
    wrong path or a program for another module is said now, not on the day a model is set."""
    from agentic_iqa.programs import ProgramError, check_module, read_program

    from_file = cdir is not None and "programs" not in overrides and isinstance(data.get("programs"), dict)
    for name, path in programs.items():
        where = f"{cdir / 'pipeline.yaml'}: `programs.{name}`" if from_file else f"setting `programs.{name}`"
        try:
            header = read_program(path)[0]
        except ProgramError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        try:
            check_module(header, name, path)
        except ProgramError as exc:
            raise ConfigError(f"{where}: {exc}; list it under `programs.{header.get('module')}` or compile one for {name}") from None


def _refuse_keys(data: dict, path: Path) -> None:
    """API keys are never read from files: say where the key goes instead of 'extra field'."""
    for role in ROLES:
        section = data.get(role)
        if not isinstance(section, dict):
            continue
        for k in section:
            if str(k).lower() in KEY_NAMES:
                var = section.get("api_key_env") or "OPENAI_API_KEY"
                raise ConfigError(
                    f"{path}: `{role}.{k}`: API keys are not read from config files, they come from the environment; "
                    f"remove it and set {var} (name another variable with `{role}.api_key_env`)"
                )


def _msg(error: dict) -> str:
    """A pydantic error's message as a reader wants it: our validators' text without "Value error, "."""
    return str(error["msg"]).removeprefix("Value error, ")


def load_settings(
    config_dir: Optional[Path | str] = None,
    *,
    lm: Optional[str] = None,
    api_base: Optional[str] = None,
    backend: Optional[str] = None,
    **pipeline_overrides,
) -> Settings:
    """Read the config directory (or defaults), apply env vars, then explicit overrides."""
    env = env_settings()
    cdir = Path(config_dir) if config_dir else default_config_dir(env)
    backends_data: dict = {}
    pipeline_data: dict = {}
    used: list[Path] = []
    if cdir is not None:
        if not cdir.is_dir():
            if os.path.lexists(cdir):  # e.g. --config cfg/pipeline.yaml: the folder is wanted, not a file in it
                raise ConfigError(f"config directory {cdir} is a file, not a folder; pass the folder holding "
                                  f"pipeline.yaml / model_backends.yaml (here: {cdir.parent})")
            raise ConfigError(f"config directory {cdir} does not exist; pass a folder holding pipeline.yaml / model_backends.yaml")
        if os.path.lexists(cdir / "model_backends.yaml"):  # present but a FIFO, a folder or a loop: said, not skipped
            backends_data = _read_yaml(cdir / "model_backends.yaml")
            _refuse_keys(backends_data, cdir / "model_backends.yaml")
            used.append(cdir / "model_backends.yaml")
        if os.path.lexists(cdir / "pipeline.yaml"):  # present but a FIFO, a folder or a loop: said, not skipped
            pipeline_data = _read_yaml(cdir / "pipeline.yaml")
            used.append(cdir / "pipeline.yaml")
    backends = _validate(ModelBackends, backends_data, (cdir or Path(".")) / "model_backends.yaml")
    pipeline = _validate(PipelineConfig, pipeline_data, (cdir or Path(".")) / "pipeline.yaml")
    # Relative paths in a config file are relative to that file's folder.
    if cdir is not None:
        pipeline.programs = {k: (v if v.is_absolute() else cdir / v) for k, v in pipeline.programs.items()}
        pipeline.tools.extra_tables = [p if p.is_absolute() else cdir / p for p in pipeline.tools.extra_tables]
    for r in ROLES:  # before the environment and flags replace them: the file is named
        if backends.role(r).api_base:
            checked_base_url(backends.role(r).api_base, f"{cdir / 'model_backends.yaml'}: `{r}.api_base`")
    if env.API_BASE:
        checked_base_url(env.API_BASE, "AGENTIC_IQA_API_BASE")
    if api_base:
        checked_base_url(api_base, "--api-base")
    sources: dict[str, str] = {}
    if pipeline_data.get("tools", {}).get("device") if isinstance(pipeline_data.get("tools"), dict) else None:
        sources["tools.device"] = f"{cdir / 'pipeline.yaml'}: tools.device"
    _env_overrides(env, backends, pipeline, sources)
    for r in ROLES:
        if lm:
            backends.role(r).model = lm
        if api_base:
            backends.role(r).api_base = api_base
    if backend:
        pipeline.backend = backend  # type: ignore[assignment]
    try:
        pipeline = PipelineConfig.model_validate({**pipeline.model_dump(), **pipeline_overrides})
        backends = ModelBackends.model_validate(backends.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"setting `{'.'.join(map(str, first['loc']))}`: {_msg(first)}") from None
    if "tools" in pipeline_overrides:
        sources["tools.device"] = "tools.device (argument)"
    if pipeline.programs and not uses_model(pipeline, backends):
        _check_unused_programs(pipeline.programs, cdir, pipeline_data, pipeline_overrides)
    return Settings(backends=backends, pipeline=pipeline, config_dir=cdir, config_files=used, sources=sources)
