"""One-line, key-path-first errors for invalid stack configuration, located by structured paths."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from common.cli import UsageError, bounded
from common.names import PROJECT

Loc = tuple[int | str, ...]
MISSING: Any = object()  # a problem with no value to show: a key that is absent
_MISSING = MISSING

# Pydantic's wording is written for developers; these are written for whoever edits the stack.
MISSING_KEY = "required key is missing"
_REASONS = {
    "missing": MISSING_KEY,
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
    "enum": "must be one of {expected}",
}


def key_path(loc: Iterable[int | str]) -> str:
    """The key as it is written in a stack file, e.g. hidden-gpu:nodes[0].name."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":
            path += " (the key)"
        else:
            path += f".{part}" if path else str(part)
    return f"{PROJECT}:{path}"


@dataclass(frozen=True)
class ConfigError:
    """One invalid value: where (a key path below `hidden-gpu:`, or a place in a file), what, why."""

    loc: Loc
    reason: str
    value: Any = _MISSING
    # Set for problems of the file rather than of a key: the file's path, or `path:line`.
    where: str | None = None

    def __str__(self) -> str:
        place = self.where if self.where is not None else key_path(self.loc)
        if self.where is not None and self.loc:  # a file's line and the key on it
            place = f"{self.where}: {key_path(self.loc)}"
        if self.value is _MISSING:
            return f"{place}: {self.reason}"
        return f"{place} = {show(self.value)}: {self.reason}"


class FieldProblemsError(ValueError):
    """Raised inside a model validator: several problems, each at a path relative to the model."""

    def __init__(self, problems: Sequence[tuple[Loc, Any, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(reason for _, _, reason in self.problems))


class InvalidConfigError(UsageError):
    """Every problem found in one stack, each a ConfigError; printed one per line."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(error) for error in self.errors))


def show(value: Any) -> str:
    """A bad value as the stack file would spell it, bounded: values can be huge."""
    try:
        text = json.dumps(value, default=str, sort_keys=True)
    except (ValueError, RecursionError):  # circular or too deep to print
        text = f"<{type(value).__name__}>"
    return bounded(text)


def _known_keys(model: type, loc: Loc) -> list[str]:
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
    return InvalidConfigError([problem for detail in error.errors() for problem in _problems(detail, model)])


def unknown_key(key: str, known: Sequence[str]) -> str:
    """Why a key is refused where only `known` ones are expected, with the likeliest meant one."""
    close = difflib.get_close_matches(key, known, n=1)
    return "unknown key" + (f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(known)}")


def _problems(detail: ErrorDetails, model: type) -> list[ConfigError]:
    loc = tuple(detail["loc"])
    kind = detail["type"]
    if kind == "missing":
        return [ConfigError(loc, _REASONS["missing"])]
    if kind == "extra_forbidden":
        return [ConfigError(loc, unknown_key(str(loc[-1]), _known_keys(model, loc)), detail["input"])]
    cause = detail.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblemsError):
        return [ConfigError(loc + where, reason, value) for where, value, reason in cause.problems]
    if kind == "value_error":
        reason = str(cause) if cause is not None else detail["msg"]
    else:
        reason = _REASONS.get(kind, detail["msg"]).format(**detail.get("ctx", {}))
    return [ConfigError(loc, reason, detail["input"])]


def _whole_numbers(value: Any) -> Any:
    """A component's inputs cross gRPC as google.protobuf.Value, where every number is a double: a whole one is the
    integer its program wrote (no model field is a float). The stack file's own path keeps YAML's types."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def as_written(model: BaseModel) -> dict[str, Any]:
    """A validated model as a stack file writes it (camelCase keys, unset options left out): what `validated`
    reads back into the same model, and what the components take as inputs."""
    return model.model_dump(by_alias=True, exclude_none=True)


class InvalidInputError(ValueError):
    """A component's input its model refuses: one line per problem, each named by the input's path."""

    @classmethod
    def of(cls, problems: Iterable[ConfigError]) -> InvalidInputError:
        """Named as a stack's problems are, but without our config namespace: a consumer's program has no stack
        file."""
        return cls("\n".join(str(p).removeprefix(f"{PROJECT}:") for p in problems))


def validated(kind: Any, value: Any, loc: Loc) -> Any:
    """One part of a stack (a node's entry, the plugin's settings, a namespace name) validated by its model or
    type, where a component takes it as an input: each problem is named by its path below `loc` (the input),
    as a stack's are by their keys."""
    try:
        return TypeAdapter(kind).validate_python(_whole_numbers(value))
    except ValidationError as error:
        raise InvalidInputError.of(
            replace(e, loc=loc + e.loc) for e in from_validation_error(error, kind).errors
        ) from None
