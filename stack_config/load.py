"""Reading a stack's `hidden-gpu:` keys: strictly from a stack file, or from the map Pulumi hands a program.

A stack file is what reviewers approve: its YAML is read by stack_yaml, which refuses anything a reviewer could
read otherwise than the program; here its config keys are checked (namespaces, secrets, the cluster keys) and its
`hidden-gpu:` keys validated by the models, every refusal an InvalidConfigError naming the file, line and key.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from common.cli import shown_path
from common.names import PROJECT
from stack_config.errors import MISSING, ConfigError, InvalidConfigError, Loc, from_validation_error, show
from stack_config.models import StackConfig
from stack_config.stack_yaml import PREFIX, file_error, foreign_values, namespaced, read_document

KUBERNETES = "kubernetes:"
# What __main__.py hands its explicit kubernetes provider; any other kubernetes: key has no effect.
KUBERNETES_KEYS = ("context", "kubeconfig", "cluster")
DISABLE_DEFAULT_PROVIDERS = "pulumi:disable-default-providers"
# How alike (difflib's ratio) a namespace must be to ours to be called a misspelling of it.
NEAR_MISS = 0.8


class StackFileConfig(dict[str, Any]):
    """A stack file's `config:` map, knowing the file and the line of every key, so that every problem
    parse_project_config finds in it names file and line as well as key and value."""

    def __init__(
        self,
        config: dict[str, Any],
        path: Path,
        lines: dict[Loc, int],
        key_lines: dict[str, int],
        environments: tuple[str, ...] = (),
    ) -> None:
        super().__init__(config)
        self.path, self.lines, self.key_lines = path, lines, key_lines
        # The ESC environments the file imports: the CLI merges them at `up`, render cannot read them.
        self.environments = environments

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        """A copy is a plain config map: once changed it no longer says what the file says."""
        return copy.deepcopy(dict(self), memo)

    def locate(self, error: ConfigError) -> ConfigError:
        """The error at the line of its key (or of the nearest enclosing key the file has)."""
        if error.where is None and error.loc:
            for end in range(len(error.loc), 0, -1):
                line = self.lines.get(error.loc[:end])
                if line is not None:
                    return dataclasses.replace(error, where=f"{self.path}:{line}")
            return dataclasses.replace(error, where=str(self.path))  # a key the file lacks altogether
        if error.where in self.key_lines and not error.loc:
            return dataclasses.replace(error, where=f"{self.path}:{self.key_lines[error.where]}: {error.where}")
        return error


def read_stack_file(path: Path) -> StackFileConfig:
    """The `config:` map of a Pulumi stack file, as written, or InvalidConfigError."""
    path = Path(shown_path(path))  # how every message names it
    document, lines, key_lines = read_document(path)
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise file_error(path, "has no 'config:' mapping")
    foreign = list(foreign_values(config, "config"))
    if foreign:
        reason = "is a YAML {} value, which Pulumi config does not hold: write it as a string, number or list"
        raise InvalidConfigError(
            [ConfigError((), reason.format(kind), where=f"{path}: {where}") for where, kind in foreign]
        )
    bad_keys = [key for key in config if not isinstance(key, str)]
    if bad_keys:
        raise file_error(path, f"config key {show(bad_keys[0])} is not a string: config keys are `namespace:name`")
    named: dict[str, Any] = {}
    for key, value in config.items():
        if namespaced(key) in named:
            raise file_error(path, f"config keys '{key}' and '{namespaced(key)}' name the same key; keep one")
        named[namespaced(key)] = value
    return StackFileConfig(named, path, lines, key_lines, _imported_environments(document))


def _imported_environments(document: dict[str, Any]) -> tuple[str, ...]:
    """The ESC environments a stack file imports (`environment:`, a list or `imports:`), as written."""
    found = document.get("environment")
    if isinstance(found, dict):
        found = found.get("imports")
    return tuple(str(name) for name in found) if isinstance(found, list) else ()


def parse_project_config(config: Mapping[str, Any]) -> StackConfig:
    """Validate the `hidden-gpu:*` entries of a full config map; other namespaces pass through.

    Values may be Python objects (from a stack file) or the JSON strings Pulumi hands a program
    for structured config. Problems in a map read_stack_file returned name the file and line too.
    """
    try:
        return _parse(config)
    except InvalidConfigError as error:
        if not isinstance(config, StackFileConfig):
            raise
        raise InvalidConfigError([config.locate(each) for each in error.errors]) from None


def _parse(config: Mapping[str, Any]) -> StackConfig:
    own = {key[len(PREFIX) :]: _decode(value) for key, value in config.items() if key.startswith(PREFIX)}
    secrets = [loc for key, value in own.items() for loc in _secrets(value, (key,))]
    if secrets:
        reason = (
            "is a Pulumi secret (secure:): which GPUs are hidden is reviewed in plain text, "
            "and the offline tools cannot decrypt it; write the value out"
        )
        raise InvalidConfigError([ConfigError(loc, reason) for loc in secrets])
    outside = [*_key_problems(config), *_cluster_problems(config)]
    try:
        stack = StackConfig.model_validate(own)
    except ValidationError as error:
        raise InvalidConfigError([*from_validation_error(error, StackConfig).errors, *outside]) from None
    if outside:
        raise InvalidConfigError(outside)
    return stack


def _invisible(text: str) -> list[str]:
    """Characters a reviewer cannot see: format (zero-width, BOM), control and non-ASCII spaces."""
    return [c for c in text if unicodedata.category(c) in ("Cf", "Cc", "Zs", "Zl", "Zp") and c != " "]


def _key_problems(config: Mapping[str, Any]) -> Iterator[ConfigError]:
    """Keys a reviewer would read as ours that the CLI files elsewhere: invisible characters, or a
    namespace one edit away from ours (`hiden-gpu:`, `Hidden-GPU:`): Pulumi would hand the program
    nothing under `hidden-gpu:` and the stack would silently run on defaults."""
    for key in config:
        hidden = _invisible(key) + ([" "] if " " in key else [])
        if hidden:
            names = ", ".join(sorted({f"U+{ord(c):04X}" for c in hidden}))
            yield ConfigError((), f"config key holds a character no reviewer sees ({names}); retype it", where=key)
            continue
        namespace, _, name = key.partition(":")
        if namespace == PROJECT or not name:
            continue
        folded = unicodedata.normalize("NFKC", namespace).casefold()
        if folded == PROJECT or difflib.SequenceMatcher(None, folded, PROJECT).ratio() >= NEAR_MISS:
            yield ConfigError((), f"unknown namespace '{namespace}'; did you mean '{PREFIX}{name}'?", where=key)


def _cluster_problems(config: Mapping[str, Any]) -> Iterator[ConfigError]:
    """The keys outside `hidden-gpu:` that decide which cluster the stack changes."""
    for key in config:
        if key.startswith(KUBERNETES) and key.removeprefix(KUBERNETES) not in KUBERNETES_KEYS:
            name = key.removeprefix(KUBERNETES)
            close = difflib.get_close_matches(name, KUBERNETES_KEYS, n=1)
            hint = (
                f"did you mean '{close[0]}'?"
                if close
                else f"the program's provider reads only {', '.join(KUBERNETES_KEYS)}"
            )
            yield ConfigError((), f"unknown key; {hint}", _decode(config[key]), where=key)
    if not any(_decode(config.get(f"{KUBERNETES}{key}")) for key in ("context", "kubeconfig")):
        yield ConfigError(
            (),
            "required: name the cluster this stack changes (kubernetes:context, or kubernetes:kubeconfig), "
            "so a typo or another current context cannot point it at the wrong one",
            where=f"{KUBERNETES}context",
        )
    disabled = _decode(config.get(DISABLE_DEFAULT_PROVIDERS))
    if not (isinstance(disabled, list) and ("kubernetes" in disabled or "*" in disabled)):
        yield ConfigError(
            (),
            'must list "kubernetes": every object goes through the stack\'s explicit provider, and a default '
            "provider would silently use whatever cluster is current",
            disabled if disabled is not None else MISSING,
            where=DISABLE_DEFAULT_PROVIDERS,
        )


def _secrets(value: Any, loc: Loc) -> Iterator[Loc]:
    """Where Pulumi's `{secure: ...}` values sit in a config value."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            yield loc
        else:
            for key, item in value.items():
                yield from _secrets(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _secrets(item, (*loc, index))


def _decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # not JSON, too deep, or a number of over 4,300 digits
        return value


def load_stack_file(path: Path) -> StackConfig:
    return parse_project_config(read_stack_file(path))
