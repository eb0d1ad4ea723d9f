"""The config `pulumi up` applies must be the stack file's, which is what reviewers read.

The Pulumi CLI hands a program more than the stack file: values from the ESC environments the stack
imports (`environment:`, merged into objects), project-level `config:` defaults in Pulumi.yaml, and
`--config` flags. None of them reaches `render` or the review, so the program reads the stack file
itself and refuses to run when any `hidden-gpu:` value it was handed differs from the file's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from common.names import PROJECT, STACK_FILE_ENV
from stack_config.errors import ConfigError, InvalidConfigError
from stack_config.load import (
    DISABLE_DEFAULT_PROVIDERS,
    KUBERNETES,
    KUBERNETES_KEYS,
    StackFileConfig,
    parse_project_config,
    read_stack_file,
)
from stack_config.models import StackConfig
from stack_config.stack_yaml import PREFIX


def stack_file_of(project_dir: Path, stack: str) -> Path:
    """Where the CLI reads the stack's file: $HIDDEN_GPU_STACK_FILE (an Automation API program's work
    directory), else Pulumi.yaml's `stackConfigDir` (default: the project directory)."""
    if os.environ.get(STACK_FILE_ENV):
        return Path(os.environ[STACK_FILE_ENV])
    project = _project_settings(project_dir)
    config_dir = project.get("stackConfigDir") if isinstance(project.get("stackConfigDir"), str) else "."
    return project_dir / str(config_dir) / f"Pulumi.{stack}.yaml"


def _project_settings(project_dir: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load((project_dir / "Pulumi.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _changes_nothing(key: str, default: Any) -> bool:
    """Whether a project default for `key` leaves the stack as it would be without it (`guard: {}`)."""
    name = key.removeprefix(PREFIX)
    field = next((f for f in StackConfig.model_fields.values() if f.alias == name), None)
    if field is None or field.is_required() or field.annotation is None:
        return False
    try:
        value = TypeAdapter(field.annotation).validate_python(default)
    except ValidationError:
        return False
    return bool(value == field.get_default(call_default_factory=True))


def project_config_problems(project_dir: Path) -> list[ConfigError]:
    """Project-level `config:` in Pulumi.yaml that gives a `hidden-gpu:` key a value no review shows: a
    `value`, the short form `key: value`, or a `default` that changes anything. Declarations of type and
    description, and defaults that change nothing (what offline.config_reference writes), are fine."""
    config = _project_settings(project_dir).get("config")
    if not isinstance(config, dict):  # absent, or the old spelling of a config directory
        return []
    keys = [
        str(key)
        for key, declared in config.items()
        if (str(key).startswith(PREFIX) or ":" not in str(key))
        and (
            not isinstance(declared, dict)
            or "value" in declared
            or ("default" in declared and not _changes_nothing(str(key), declared["default"]))
        )
    ]
    reason = "sets a value for every stack that no stack file shows; write it in each stack file instead"
    return [ConfigError((), reason, where=f"{project_dir / 'Pulumi.yaml'}: config.{key}") for key in keys]


def handed_config(written: Mapping[str, Any] | None, value_of: Callable[[str], str | None]) -> dict[str, str]:
    """What the CLI handed the program, read one key at a time through `value_of` (the program passes the public
    `pulumi.Config(namespace).get`, which cannot list keys): every key the program reads, and every key the stack's
    file (`written`) names, so a misspelt one there is refused as `render` refuses it. A key that only an ESC
    environment or `--config` adds, under a name nothing reads, is never read and changes nothing."""
    keys = [f"{PREFIX}{field.alias or name}" for name, field in StackConfig.model_fields.items()]
    keys += [*(f"{KUBERNETES}{key}" for key in KUBERNETES_KEYS), DISABLE_DEFAULT_PROVIDERS, *(written or ())]
    return {key: value for key in dict.fromkeys(keys) if (value := value_of(key)) is not None}


def reviewed_stack(project_dir: Path, stack: str, value_of: Callable[[str], str | None]) -> StackConfig:
    """The stack the program runs: what the CLI handed it (handed_config), refused unless it is exactly what the
    stack's file says (check_reviewed). The file is read once for both."""
    path = stack_file_of(project_dir, stack)
    written = read_stack_file(path) if path.exists() else None
    handed = parse_project_config(handed_config(written, value_of))
    check_reviewed(handed, project_dir, stack, written)
    return handed


def check_reviewed(handed: StackConfig, project_dir: Path, stack: str, written: StackFileConfig | None = None) -> None:
    """InvalidConfigError unless `handed` is exactly what the stack's file (and only it) says; `written`, the file
    as read_stack_file read it, if the caller has it."""
    path = stack_file_of(project_dir, stack)
    problems = project_config_problems(project_dir)
    if problems:
        raise InvalidConfigError(problems)
    reviewed = parse_project_config(written if written is not None else read_stack_file(path))
    differing = [
        f"{PREFIX}{field.alias or name}"
        for name, field in StackConfig.model_fields.items()
        if getattr(handed, name) != getattr(reviewed, name)
    ]
    if differing:
        reason = (
            f"differs from {path}: the Pulumi CLI merged in another value (an ESC environment the stack "
            f"imports, Pulumi.yaml's project config, or --config); {PROJECT} applies only what the stack "
            "file says, so put the value there"
        )
        raise InvalidConfigError([ConfigError((), reason, where=key) for key in differing])
