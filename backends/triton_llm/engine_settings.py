"""Engine settings of one model version: config.pbtxt parameters, then a vllm_backend `model.json`
(vLLM engine arguments, vllm_engine_args.py), then `engine.json`, both in the version folder (the
later win), typed by EngineConfig's own fields."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from pathlib import Path
from typing import Any

from llm_engine.config import EngineConfig
from vllm_engine_args import translate

# Parameters of the backend itself, not of the engine.
BACKEND_KEYS = {"triton_cache_dir", "shutdown_timeout_s", "metrics_interval_s", "max_prompt_bytes", "engine_process",
                "engine_stall_timeout_s", "engine_max_restarts"}
# max_prompt_bytes: text_input / messages larger than this are refused before tokenization.
# engine_process: the engine runs in a child process of the stub (true) or in a thread of the stub (false).
# engine_stall_timeout_s: an engine whose loop reports nothing for this long is hung: killed and restarted
# (a step, even a long prefill, reports within seconds; warm-up happens before the model is ready).
# engine_max_restarts: restarts allowed within 10 minutes; beyond, the model needs an unload and a load.
# metrics_interval_s: how stale the gauges may be; a refresh is a few metric sets, so a load balancer or
# autoscaler reading running / waiting / KV use sees the engine of a quarter second ago at most.
BACKEND_DEFAULTS = {"shutdown_timeout_s": 30.0, "metrics_interval_s": 0.25, "max_prompt_bytes": 1 << 20,
                    "engine_process": True, "engine_stall_timeout_s": 30.0, "engine_max_restarts": 3}


def _convert(name: str, raw: Any, annotation: Any) -> Any:
    """A config.pbtxt parameter is a string; engine.json values arrive typed already."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.lower() in ("", "none", "null"):
        return None
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    for kind in kinds:
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return text.lower() in ("true", "1")
            if kind in (int, float):
                return kind(text)
        except ValueError:
            continue
        if kind is str:
            return text
    raise ValueError(f"parameter '{name}' = {raw!r} is not a valid {annotation}")


def load_settings(model_config: dict, version_dir: Path) -> tuple[EngineConfig, dict[str, Any], list[str]]:
    """The engine's config, the backend's own settings, and warnings for the log."""
    values: dict[str, Any] = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
    warnings: list[str] = []
    vllm_json = version_dir / "model.json"
    if vllm_json.is_file():
        settings, warnings = translate(_read_json(vllm_json), str(vllm_json))
        values.update(settings)
    engine_json = version_dir / "engine.json"
    if engine_json.is_file():
        values.update(_read_json(engine_json))
    backend = dict(BACKEND_DEFAULTS)
    backend.update({k: values.pop(k) for k in list(values) if k in BACKEND_KEYS})
    hints = typing.get_type_hints(EngineConfig)
    fields = {f.name for f in dataclasses.fields(EngineConfig) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"unknown engine parameter(s) {unknown}; known: {sorted(fields | BACKEND_KEYS)}")
    kwargs = {k: _convert(k, v, hints[k]) for k, v in values.items()}
    # A relative model path is a folder inside the version directory (default: "model").
    given = str(kwargs.get("model") or "model")
    model = Path(os.path.expanduser(given))
    kwargs["model"] = str(model if model.is_absolute() else version_dir / model)
    if not Path(kwargs["model"]).is_dir():
        raise ValueError(f"model {given!r}: no folder {kwargs['model']}. Name a local Hugging Face folder (an "
                         f"absolute path, or a folder inside {version_dir}) in config.pbtxt's `model` parameter, "
                         "engine.json or a vllm_backend model.json: nothing is downloaded (a hub id such as "
                         "'org/name' is not fetched)")
    for key in ("shutdown_timeout_s", "metrics_interval_s", "engine_stall_timeout_s"):
        backend[key] = _checked(key, float, backend[key], 0)
    backend["max_prompt_bytes"] = _checked("max_prompt_bytes", int, backend["max_prompt_bytes"], 1)
    backend["engine_max_restarts"] = _checked("engine_max_restarts", int, backend["engine_max_restarts"], 0)
    engine_process = _convert("engine_process", backend["engine_process"], bool)  # empty: the default
    if engine_process is not None and not isinstance(engine_process, bool):
        raise ValueError(f"parameter 'engine_process' = {engine_process!r} is not a valid bool")
    backend["engine_process"] = BACKEND_DEFAULTS["engine_process"] if engine_process is None else engine_process
    return EngineConfig(**kwargs), backend, warnings


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None



def _checked(name: str, kind: type, raw: Any, minimum: float) -> float | int:
    """`raw` as `kind`: a float above `minimum` and finite, an int at least `minimum`."""
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise ValueError(f"parameter '{name}' = {raw!r} is not a valid {kind.__name__}") from None
    valid = (minimum < value < math.inf) if kind is float else value >= minimum
    if not valid:
        raise ValueError(f"parameter '{name}' must be {'>' if kind is float else '>='} {minimum}, got {raw!r}")
    return value
