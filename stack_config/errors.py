"""One-line, key-path-first errors for invalid stack configuration."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

PROJECT = "hidden-gpu"

_MISSING = object()

# Pydantic's wording is written for developers; these are written for whoever edits the stack.
_REASONS = {
    "missing": "required key is missing",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "greater_than_equal": "must be at least {ge}",
    "too_short": "must not be empty",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "literal_error": "must be one of {expected}",
}


class ConfigError(Exception):
    """An invalid value in a stack's configuration, located by its full key path."""

    def __init__(self, where: str, value: Any = _MISSING, reason: str = "invalid value") -> None:
        self.where = where
        self.value = value
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.value is _MISSING:
            return f"{self.where}: {self.reason}"
        return f"{self.where} = {_show(self.value)}: {self.reason}"


def config_key(path: str) -> str:
    """The key as it is written in a stack file, e.g. hidden-gpu:nodes[0].name."""
    return f"{PROJECT}:{path}"


class InvalidConfigError(Exception):
    """All problems pydantic found in one stack, each as a ConfigError."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(error) for error in self.errors))


def _show(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(loc: Iterable[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":
            path += " (the key)"
        else:
            path += f".{part}" if path else str(part)
    return config_key(path)


def _known_keys(model: type, loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model expects at the mapping that holds loc's last part."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", {})
        field = next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return []
        current = field.annotation
        for candidate in getattr(current, "__args__", ()) or ():
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
    fields = getattr(current, "model_fields", {})
    return [field.alias for field in fields.values() if field.alias]


def from_validation_error(error: ValidationError, model: type) -> InvalidConfigError:
    problems = [_one(detail, model) for detail in error.errors()]
    return InvalidConfigError(problems)


def _one(detail: ErrorDetails, model: type) -> ConfigError:
    loc = tuple(detail["loc"])
    kind = detail["type"]
    if kind == "missing":
        return ConfigError(_key(loc), reason=_REASONS["missing"])
    if kind == "extra_forbidden":
        known = _known_keys(model, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(known)}"
        return ConfigError(_key(loc), detail["input"], "unknown key" + hint)
    if kind == "value_error":
        reason = str(detail["ctx"]["error"]) if "ctx" in detail else detail["msg"]
    else:
        reason = _REASONS.get(kind, detail["msg"]).format(**detail.get("ctx", {}))
    return ConfigError(_key(loc), detail["input"], reason)
