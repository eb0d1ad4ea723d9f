"""Reading a stack's `hidden-gpu:` keys from Pulumi's config or from a stack file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stack_config.errors import PROJECT, ConfigError, InvalidConfigError, from_validation_error
from stack_config.models import StackConfig

PREFIX = f"{PROJECT}:"
STACKS_DIR = Path(__file__).resolve().parent.parent / "stacks"


def parse_project_config(config: Mapping[str, Any]) -> StackConfig:
    """Validate the `hidden-gpu:*` entries of a full config map; other namespaces pass through.

    Values may be Python objects (from a stack file) or the JSON strings Pulumi hands a program
    for structured config.
    """
    own = {key[len(PREFIX) :]: _decode(value) for key, value in config.items() if key.startswith(PREFIX)}
    try:
        return StackConfig.model_validate(own)
    except ValidationError as error:
        raise from_validation_error(error, StackConfig) from None
    except ConfigError as error:
        raise InvalidConfigError([error]) from None


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `config:` map of a Pulumi stack file, as written."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InvalidConfigError([ConfigError(str(path), reason=f"cannot read stack file: {error.strerror}")]) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidConfigError([ConfigError(str(path), reason=f"not valid YAML{where}")]) from None
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise InvalidConfigError([ConfigError(str(path), reason="has no 'config:' mapping")])
    return config


def load_stack_file(path: Path) -> StackConfig:
    return parse_project_config(read_stack_file(path))


def stack_name_of(path: Path) -> str:
    """The stack a file configures: Pulumi.<stack>.yaml, else the file's stem."""
    name = path.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")):
        return name[len("Pulumi.") :].rsplit(".", 1)[0]
    return path.stem


def find_stack_file(stack_name: str) -> Path:
    """stacks/Pulumi.<stack_name>.yaml, where `pulumi stack select` looks (stackConfigDir)."""
    path = STACKS_DIR / f"Pulumi.{stack_name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(stack_name_of(p) for p in STACKS_DIR.glob("Pulumi.*.yaml")))
        raise InvalidConfigError(
            [ConfigError(f"--stack {stack_name}", reason=f"no stack file {path.name} in stacks/ (stacks: {known})")]
        )
    return path
