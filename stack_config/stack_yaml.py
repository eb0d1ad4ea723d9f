"""A stack file's YAML, read as strictly as a reviewer needs: a key given twice (PyYAML would keep the last
without a word; the Pulumi CLI refuses it), anchors, aliases and merge keys under `hidden-gpu:`, scalars the CLI's
YAML 1.2 reads otherwise (`1:30`, `1e3`, `0o7`, dates), YAML types config cannot hold, and input whose cost is
unbounded (size, nesting, alias expansion) are refused, each naming the file, line and key."""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from common.cli import FileRefusedError, bounded, read_regular_file
from common.names import PROJECT
from stack_config.errors import ConfigError, InvalidConfigError, Loc, show

PREFIX = f"{PROJECT}:"
# Stack files are a few KB; these bound what a hostile or broken one can cost.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 200_000
# A plain number longer than this is no config value (2**64 has 20 digits), and Python refuses to read one of
# more than 4,300 digits (sys.set_int_max_str_digits).
MAX_NUMBER_CHARS = 100
INT_TAG = "tag:yaml.org,2002:int"
MERGE_TAG = "tag:yaml.org,2002:merge"
BOM = "\ufeff"


class _Pulumi12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the CLI's booleans (gopkg.in/yaml.v3: only true/false; `yes`, `on` stay
    strings) and no timestamps; scalars it still reads otherwise than the CLI are refused (cli_reading)."""


_Pulumi12Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Pulumi12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def file_error(path: Path, reason: str, line: int | None = None) -> InvalidConfigError:
    where = f"{path}:{line}" if line is not None else str(path)
    return InvalidConfigError([ConfigError((), reason, where=where)])


def file_text(path: Path) -> str:
    try:
        data = read_regular_file(path, MAX_FILE_BYTES, "stack file")
    except FileRefusedError as error:
        raise file_error(path, error.reason) from None
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise file_error(path, f"not UTF-8 text (byte {error.start})", line) from None


def too_deep(text: str, limit: int, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> int | None:
    """The line where YAML (or JSON) `text` nests deeper than `limit` collections, or None. Walks the event
    stream, iteratively: PyYAML's composer and Python's json recurse, and would fail at a thousand levels."""
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limit:
                return event.start_mark.line + 1 if event.start_mark else 0
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _check_depth(path: Path, text: str) -> None:
    line = too_deep(text, MAX_DEPTH, _Pulumi12Loader)
    if line is not None:
        raise file_error(path, f"nested deeper than {MAX_DEPTH} levels", line or None)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_graph(path: Path, root: yaml.Node) -> None:
    """What aliases make of the file, each shared node visited once: a value that contains itself (yaml.v3
    refuses it: "anchor ... value contains itself"), nesting deeper than MAX_DEPTH or more than MAX_NODES values
    once aliases expand (a 1 KB alias bomb is billions); and every scalar, keys included (_check_scalar)."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    entered: set[int] = set()  # entered and not yet left: the ancestors of what is visited now
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # depth-first without recursion; a node popped while entered is its own descendant
        node, leaving = stack.pop()
        line = node.start_mark.line + 1
        if leaving:
            entered.discard(id(node))
            children = _children(node)
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            own = 0 if isinstance(node, yaml.ScalarNode) else 1
            depths[id(node)] = own + max((depths[id(child)] for child in children), default=0)
            if sizes[id(node)] > MAX_NODES:
                raise file_error(path, f"expands to more than {MAX_NODES} values (aliases?): not a stack file", line)
            if depths[id(node)] > MAX_DEPTH:
                raise file_error(path, f"nested deeper than {MAX_DEPTH} levels through aliases", line)
        elif id(node) in entered:
            raise file_error(path, "a value that contains itself (an alias inside its own anchor)", line)
        elif id(node) not in sizes:
            _check_scalar(path, node)
            entered.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))


def _check_scalar(path: Path, node: yaml.Node) -> None:
    """Scalars the Pulumi CLI refuses, or that Python cannot read."""
    if not isinstance(node, yaml.ScalarNode):
        return
    line = node.start_mark.line + 1
    if any("\ud800" <= c <= "\udfff" for c in node.value):
        raise file_error(
            path,
            "a \\uD800-\\uDFFF escape (half of a UTF-16 pair, no character): the Pulumi CLI refuses the file "
            "(yaml.v3: invalid Unicode character escape code); write the character itself",
            line,
        )
    if node.tag == INT_TAG and len(node.value) > MAX_NUMBER_CHARS:
        raise file_error(
            path,
            f"a number of {len(node.value)} characters: no config value is that long (quote it if it is text)",
            line,
        )


def _key_text(node: yaml.Node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else f"<{node.tag.rsplit(':', 1)[-1]}>"


def _walk(node: yaml.Node, path: str) -> Iterator[tuple[yaml.Node, str]]:
    yield node, path
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _walk(value, f"{path}.{_key_text(key)}" if path else _key_text(key))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _walk(item, f"{path}[{index}]")


def _config_node(root: yaml.Node) -> yaml.MappingNode | None:
    if not isinstance(root, yaml.MappingNode):
        return None
    config = next((value for key, value in root.value if _key_text(key) == "config"), None)
    return config if isinstance(config, yaml.MappingNode) else None


def namespaced(key: str) -> str:
    """A config key as Pulumi names it: a key without a namespace is the project's
    (`nodes` is `hidden-gpu:nodes`; sdk/go/common/workspace/loaders.go, stackConfigNamespacedWithProject)."""
    return key if ":" in key else f"{PREFIX}{key}"


def _check_keys(path: Path, root: yaml.Node) -> None:
    """Each key once in every mapping; no alias or merge key under `hidden-gpu:`."""
    problems = [*_duplicate_keys(path, root), *_shared_values(path, root)]
    if problems:
        raise InvalidConfigError(problems)


def _duplicate_keys(path: Path, root: yaml.Node) -> Iterator[ConfigError]:
    seen: set[int] = set()
    for node, key_path in _walk(root, ""):
        if not isinstance(node, yaml.MappingNode) or id(node) in seen:
            continue
        seen.add(id(node))
        first_line: dict[str, int] = {}
        for key, _ in node.value:
            line, name = key.start_mark.line + 1, _key_text(key)
            if name not in first_line:
                first_line[name] = line
                continue
            full = f"{key_path}.{name}" if key_path else name
            reason = (
                f"key '{full}' given twice (lines {first_line[name]} and {line}): "
                "a reviewer reads one, YAML keeps the other"
            )
            yield ConfigError((), reason, where=f"{path}:{line}")


def _shared_values(path: Path, root: yaml.Node) -> Iterator[ConfigError]:
    """Aliases (a node met twice) and merge keys under `hidden-gpu:` keys."""
    config = _config_node(root)
    if config is None:
        return
    # An aliased node is one node met on several paths; _check_size bounded this walk already.
    paths_to = Counter(id(node) for node, _ in _walk(root, ""))
    for key, value in config.value:
        if not namespaced(_key_text(key)).startswith(PREFIX):
            continue
        for node, key_path in _walk(value, namespaced(_key_text(key))):
            merges = isinstance(node, yaml.MappingNode) and any(k.tag == MERGE_TAG for k, _ in node.value)
            if paths_to[id(node)] > 1 or merges:
                reason = (
                    f"{key_path}: aliases and merge keys are refused under {PREFIX} "
                    "(they hide what a reviewer reads); write the values out"
                )
                yield ConfigError((), reason, where=f"{path}:{node.start_mark.line + 1}")
                break


# How the Pulumi CLI reads a plain scalar into a config value: gopkg.in/yaml.v3 v3.0.1 resolve.go
# (resolveMap, resolve(): timestamps, strconv.ParseInt/ParseUint base 0 after dropping `_`,
# yamlStyleFloat, 0b/0o), then sdk/go/common/resource/config/object.go unmarshalObject (a timestamp
# becomes time.Time.String(), not the text).
_CLI_WORDS: dict[str, Any] = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL")),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_CLI_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_CLI_TIMESTAMP = re.compile(
    r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]+)?(Z|[-+][0-9]{2}:[0-9]{2})?)?$"
)
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}


class _Timestamp(str):
    """What the CLI makes of a date: a different string than the one written."""


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), or ParseUint: an optional sign, then 0x/0o/0b or a leading 0 for octal."""
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in "+-" else text
    base, digits = 10, body
    if body[:2].lower() in ("0x", "0o", "0b"):
        base, digits = {"x": 16, "o": 8, "b": 2}[body[1].lower()], body[2:]
    elif body.startswith("0") and len(body) > 1:
        base, digits = 8, body[1:]
    if not digits or any(c not in _DIGITS[base] for c in digits):
        return None
    value = sign * int(digits, base)
    return value if -(2**63) <= value < 2**64 else None


def cli_reading(text: str) -> Any:
    """The value the Pulumi CLI reads from an untagged plain scalar."""
    if text in _CLI_WORDS:
        return _CLI_WORDS[text]
    if text[:1] == ".":
        return float(text) if _CLI_FLOAT.match(text) else text
    if not text[:1] or text[0] not in "+-0123456789":
        return text
    if _CLI_TIMESTAMP.match(text):
        return _Timestamp(text)
    plain = text.replace("_", "")
    number = _go_int(plain)
    if number is None and _CLI_FLOAT.match(plain):
        # strconv.ParseFloat fails out of range (1e400), and yaml.v3 then keeps the text.
        return float(plain) if math.isfinite(float(plain)) else text
    return text if number is None else number


def _same_reading(ours: Any, cli: Any) -> bool:
    if isinstance(cli, _Timestamp) or type(ours) is bool or type(cli) is bool or ours is None or cli is None:
        return not isinstance(cli, _Timestamp) and ours is cli
    if isinstance(ours, int | float) and isinstance(cli, int | float):
        return ours == cli or (math.isnan(ours) and math.isnan(cli))
    return type(ours) is type(cli) and ours == cli


def _scalar_problems(path: Path, root: yaml.Node, loader: yaml.SafeLoader) -> Iterator[ConfigError]:
    """Plain scalars under `hidden-gpu:` that this reader (YAML 1.1 numbers) and the CLI (YAML 1.2) read
    differently: `1:30` (90 or a string), `1e3` (a string or 1000), `0o7`, a date."""
    config = _config_node(root)
    for key, value in config.value if config is not None else []:
        if not namespaced(_key_text(key)).startswith(PREFIX):
            continue
        for node, key_path in _walk(value, namespaced(_key_text(key))):
            if not isinstance(node, yaml.ScalarNode) or node.style is not None:
                continue
            ours, cli = loader.construct_object(node), cli_reading(node.value)
            if not _same_reading(ours, cli):
                theirs = "a timestamp" if isinstance(cli, _Timestamp) else show(cli)
                reason = (
                    f"{key_path} = {node.value}: read as {show(ours)} here and as {theirs} by the Pulumi CLI "
                    "(YAML 1.2); quote it, or write the value plainly"
                )
                yield ConfigError((), reason, where=f"{path}:{node.start_mark.line + 1}")


_YAML_KINDS = {bytes: "!!binary", set: "!!set", datetime.date: "!!timestamp", datetime.datetime: "!!timestamp"}


def foreign_values(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Values the safe loader builds that JSON (how Pulumi hands config over) has no form for."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from foreign_values(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from foreign_values(item, f"{where}[{index}]")
    elif type(value) in _YAML_KINDS:
        yield where, _YAML_KINDS[type(value)]


def _lines(root: yaml.Node) -> tuple[dict[Loc, int], dict[str, int]]:
    """Line of every key under `hidden-gpu:` (by its path below the prefix) and of every top-level key."""
    lines: dict[Loc, int] = {}
    key_lines: dict[str, int] = {}
    config = _config_node(root)

    def walk(node: yaml.Node, loc: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                lines.setdefault((*loc, _key_text(key)), key.start_mark.line + 1)
                walk(value, (*loc, _key_text(key)))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines.setdefault((*loc, index), item.start_mark.line + 1)
                walk(item, (*loc, index))

    for key, value in config.value if config is not None else []:
        full = namespaced(_key_text(key))
        key_lines.setdefault(full, key.start_mark.line + 1)
        if full.startswith(PREFIX):
            name = full[len(PREFIX) :]
            lines.setdefault((name,), key.start_mark.line + 1)
            walk(value, (name,))
    return lines, key_lines


# The parser's words for the usual slips, and ours.
_YAML_SLIPS = (
    ("expected <block end>", "a line is indented differently from the keys around it"),
    (
        "mapping values are not allowed here",
        "a ': ' where no key can start: quote a value that holds ': ', or fix the indentation",
    ),
    ("could not find expected ':'", "a key without its ':', or a value running onto the next line (quote it)"),
    (
        "cannot start any token",
        "a tab or a reserved character (`@`, backquote) starts a value: YAML indents with spaces; quote the value",
    ),
    ("found unexpected end of stream", "a quote or bracket is never closed"),
    ("expected ',' or ']'", "a [list] is not closed, or an item in it needs quotes"),
    ("expected ',' or '}'", "a {mapping} is not closed, or a value in it needs quotes"),
    ("found undefined alias", "a *name with no &name before it: write the value out"),
    ("expected a single document", "more than one document (---): a stack file is one"),
)


def _in_our_words(error: yaml.MarkedYAMLError) -> str:
    said = " ".join(str(part) for part in (error.context, error.problem) if part)
    ours = next((text for words, text in _YAML_SLIPS if words in said), None)
    return f"{ours} (YAML: {bounded(said, 120)})" if ours else bounded(said, 200)


def read_document(path: Path) -> tuple[Any, dict[Loc, int], dict[str, int]]:
    """The stack file's document, each `hidden-gpu:` key's line by its place and each config key's line; or
    InvalidConfigError naming the file (and line) of the first refusal."""
    text = file_text(path)
    try:
        _check_depth(path, text)
        loader = _Pulumi12Loader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise file_error(path, "is empty: a stack file needs a 'config:' mapping")
            _check_graph(path, root)
            _check_keys(path, root)
            ambiguous = list(_scalar_problems(path, root, loader))
            if ambiguous:
                raise InvalidConfigError(ambiguous)
            document = loader.construct_document(root)
            lines, key_lines = _lines(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        raise file_error(path, f"not valid YAML: {_in_our_words(error)}", line) from None
    except yaml.YAMLError as error:  # e.g. a ReaderError: a character YAML does not allow
        raise file_error(path, f"not valid YAML: {bounded(str(error), 200)}") from None
    return document, lines, key_lines
