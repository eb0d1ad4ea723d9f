"""Per-object, per-field difference between two render directories, identity first.

    python -m offline.diff BASE_DIR HEAD_DIR [--exit-code] [--json]

What a reviewer needs from a change to which GPUs a cluster may touch, in this order: every GPU UUID
that moved between exposed and hidden (one line each, per node, hidden ones included); every resource
whose Pulumi identity changes (a URN changed without an alias is a delete and a create) or whose options
change (retainOnDelete, protect, parent, provider, dependencies); then which objects appear, disappear
or change, field by field. An added or removed device plugin names its node and the UUIDs it exposes;
a node that leaves the stack is flagged; each node whose GPUs moved shows as a map, one mark per GPU, before
and after. With --exit-code the status is 1 when the renders differ; --json prints the same as data.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.cli import EXIT_FINDING, EXIT_OK, UsageError, can_print, parser, read_regular_file, run, shown_path
from common.names import GRAPH_FILE, INSTANCE_LABEL, VISIBLE_DEVICES_ENV
from stack_config.stack_yaml import too_deep

_ABSENT = object()
NO_CHANGES = "no changes"
# A rendered file is a few KB, the graph of a 1,000-node stack a few MB; rendered objects nest about 12 deep.
MAX_RENDERED_BYTES = 64 << 20
MAX_RENDERED_DEPTH = 64
# libyaml's parser where PyYAML has it: the depth is checked first, so its recursion in C is bounded.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# One mark per GPU, so that a reviewer of a UUID move sees marks change places without reading UUIDs; the
# ASCII ones where stdout cannot print the others.
MARKS = {False: {"exposed": "■", "hidden": "□", None: "·"}, True: {"exposed": "#", "hidden": "-", None: "."}}
MAP_LEGEND = {
    ascii_only: f"{marks['exposed']} exposed, {marks['hidden']} hidden" for ascii_only, marks in MARKS.items()
}


def gpu_marks(gpus: dict[str, list[str]], ascii_only: bool = False) -> str:
    """A node's GPUs (`{"exposed": [...], "hidden": [...]}`, as the graph file has them), one mark each."""
    return "".join(MARKS[ascii_only][role] for role in ("exposed", "hidden") for _ in gpus.get(role) or [])


def _read(path: Path) -> Any:
    """A rendered file's YAML (or JSON), refused in one line when it is no rendered file: a FIFO or a link to
    /dev/zero (before reading), nesting the parser would fail on, text that is not UTF-8 or YAML."""
    text = read_regular_file(path, MAX_RENDERED_BYTES, "rendered file").decode("utf-8", errors="replace")
    try:
        line = too_deep(text, MAX_RENDERED_DEPTH, _LOADER)
        if line is not None:
            raise UsageError(f"{shown_path(path)}:{line}: nested deeper than {MAX_RENDERED_DEPTH} levels: not a render")
        return yaml.load(text, Loader=_LOADER)  # a safe loader: libyaml parser, safe constructor
    except yaml.YAMLError as error:
        raise UsageError(f"{shown_path(path)}: cannot read a rendered file ({type(error).__name__})") from None
    except ValueError:  # an integer of over 4,300 digits
        raise UsageError(f"{shown_path(path)}: a number too long to be rendered: not a render") from None


def _load(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise UsageError(f"{shown_path(directory)}: not a directory")
    objects = {}
    for path in sorted(directory.glob("*.yaml")):
        objects[path.name] = _read(path)
    return objects


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").strip()


def _key(item: Any) -> str | None:
    """Lists of named things (containers, env, volumes) are compared by name, not position."""
    return item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else None


def field_changes(base: Any, head: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(field path, old, new) for every leaf that differs."""
    if isinstance(base, dict) and isinstance(head, dict):
        changes = []
        for key in sorted(set(base) | set(head)):
            child = f"{path}.{key}" if path else str(key)
            changes += field_changes(base.get(key, _ABSENT), head.get(key, _ABSENT), child)
        return changes
    if isinstance(base, list) and isinstance(head, list):
        base_keys, head_keys = [_key(i) for i in base], [_key(i) for i in head]
        if all(base_keys) and all(head_keys) and len(set(base_keys)) == len(base) and len(set(head_keys)) == len(head):
            by_name_base = dict(zip(base_keys, base, strict=True))
            by_name_head = dict(zip(head_keys, head, strict=True))
            changes = []
            for name in [*base_keys, *(k for k in head_keys if k not in by_name_base)]:
                assert name is not None
                changes += field_changes(
                    by_name_base.get(name, _ABSENT), by_name_head.get(name, _ABSENT), f"{path}[{name}]"
                )
            return changes
        if len(base) == len(head):
            return [
                c for i, (b, h) in enumerate(zip(base, head, strict=True)) for c in field_changes(b, h, f"{path}[{i}]")
            ]
    return [] if base == head else [(path, base, head)]


def _gpus(obj: Any) -> str | None:
    """`node N exposes UUID,...` for a device-plugin DaemonSet, else None."""
    if not isinstance(obj, dict) or obj.get("kind") != "DaemonSet":
        return None
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []):
        devices = {e.get("name"): e.get("value") for e in container.get("env", [])}.get(VISIBLE_DEVICES_ENV)
        if devices is not None:
            node = (obj.get("metadata", {}).get("labels") or {}).get(INSTANCE_LABEL, "?")
            return f"node {node} exposes {devices}"
    return None


def _context(obj: Any, removed: bool) -> list[str]:
    """What a reviewer must not miss about an object that comes or goes."""
    gpus = _gpus(obj)
    if gpus is not None:
        return [f"    {gpus}" + (" (no longer)" if removed else "")]
    if removed and isinstance(obj, dict) and obj.get("kind") == "Node":
        node = obj.get("metadata", {}).get("name")
        return [f"    ! node {node} leaves the stack: its labels stay on the node (retained), so it stays hidden"]
    return []


def _graph(directory: Path) -> dict[str, Any]:
    path = directory / GRAPH_FILE
    found = _read(path) if path.exists() else None  # JSON is YAML
    return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class Move:
    """A GPU whose role on its node changed (None: not listed)."""

    node: str
    uuid: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        return f"! node {self.node}: {self.uuid} {self.before or '(not listed)'} -> {self.after or '(not listed)'}"


def _roles(gpus: Any) -> dict[str, str]:
    """UUID -> role of one node's GPUs in the graph file, in stack order (exposed, then hidden)."""
    gpus = gpus if isinstance(gpus, dict) else {}
    return {uuid: role for role in ("exposed", "hidden") for uuid in gpus.get(role) or []}


def moves(base: dict[str, Any], head: dict[str, Any]) -> list[Move]:
    """Every GPU whose role on its node changed, hidden ones included (they are in no object)."""
    found = []
    old_nodes, new_nodes = base.get("gpus") or {}, head.get("gpus") or {}
    for node in sorted(set(old_nodes) | set(new_nodes)):
        old, new = _roles(old_nodes.get(node)), _roles(new_nodes.get(node))
        found += [
            Move(node, u, old.get(u), new.get(u)) for u in sorted(set(old) | set(new)) if old.get(u) != new.get(u)
        ]
    return found


def gpu_moves(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """One line per GPU whose role on its node changed."""
    return [str(move) for move in moves(base, head)]


def node_maps(base: dict[str, Any], head: dict[str, Any], ascii_only: bool = False) -> dict[str, tuple[str, str]]:
    """Per node whose GPUs moved, its map before and after, one mark per GPU in the base's stack order (new
    UUIDs after them): a swap of two UUIDs shows as two marks that change, where counts stay the same."""
    maps = {}
    marks = MARKS[ascii_only]
    for node in sorted({move.node for move in moves(base, head)}):
        old, new = _roles((base.get("gpus") or {}).get(node)), _roles((head.get("gpus") or {}).get(node))
        order = [*old, *(uuid for uuid in new if uuid not in old)]
        maps[node] = ("".join(marks[old.get(u)] for u in order), "".join(marks[new.get(u)] for u in order))
    return maps


def _short(urn: str) -> str:
    """type::name of a URN: what tells two resources apart in a review line."""
    parts = urn.split("::")
    return f"{parts[2].rsplit('$', 1)[-1]}::{parts[3]}" if len(parts) >= 4 else urn


WATCHED_OPTIONS = ("parent", "provider", "retainOnDelete", "protect", "dependsOn")


def identity_changes(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Kubernetes objects whose URN changes (the same file, another URN: a delete and a create for Pulumi
    unless an alias carries the old one) and option changes of every resource that stays."""
    old = {r["urn"]: r for r in base.get("resources") or []}
    new = {r["urn"]: r for r in head.get("resources") or []}
    old_files = {r["file"]: urn for urn, r in old.items() if "file" in r}
    new_files = {r["file"]: urn for urn, r in new.items() if "file" in r}
    lines, pairs = [], [(urn, urn) for urn in sorted(set(old) & set(new))]
    for file in sorted(set(old_files) & set(new_files)):
        before, after = old_files[file], new_files[file]
        if before == after:
            continue
        renamed = f"{file}: renamed {_short(before)} -> {_short(after)}"
        if before in (new[after].get("aliases") or []):
            lines.append(f"  {renamed} with an alias: Pulumi keeps the object")
            pairs.append((before, after))
        else:
            lines.append(
                f"! {renamed} without an alias: Pulumi deletes the object and creates it again "
                "(AlreadyExists, or a window without it); add an alias"
            )
    for before_urn, after_urn in pairs:
        before, after = old[before_urn], new[after_urn]
        label = after.get("file") or _short(after["urn"])
        for option in WATCHED_OPTIONS:
            if before.get(option) != after.get(option):
                old_value, new_value = _show(before.get(option, _ABSENT)), _show(after.get(option, _ABSENT))
                lines.append(f"! {label}: {option} {old_value} -> {new_value}")
    return lines


@dataclass
class Comparison:
    """Two renders compared: what the text and the JSON both say."""

    moves: list[Move] = field(default_factory=list)
    maps: dict[str, tuple[str, str]] = field(default_factory=dict)
    identity: list[str] = field(default_factory=list)
    # Per object that differs: (file, "added" | "removed" | "changed", its field changes, context lines).
    objects: list[tuple[str, str, list[tuple[str, Any, Any]], list[str]]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.moves or self.identity or self.objects)


def compare(base_dir: Path, head_dir: Path, ascii_only: bool = False) -> Comparison:
    base, head = _load(base_dir), _load(head_dir)
    base_graph, head_graph = _graph(base_dir), _graph(head_dir)
    result = Comparison()
    if base_graph and head_graph:
        result.moves = moves(base_graph, head_graph)
        result.maps = node_maps(base_graph, head_graph, ascii_only)
        result.identity = identity_changes(base_graph, head_graph)
    elif base_graph or head_graph:  # a render from before the graph existed: nothing to compare it with
        result.identity = [
            f"  ({'base' if not base_graph else 'head'} render has no {GRAPH_FILE}: identity not compared)"
        ]
    for name in sorted(set(base) | set(head)):
        if name not in head:
            result.objects.append((name, "removed", [], _context(base[name], removed=True)))
        elif name not in base:
            result.objects.append((name, "added", [], _context(head[name], removed=False)))
        elif base[name] != head[name]:
            result.objects.append((name, "changed", field_changes(base[name], head[name]), []))
    return result


def text(result: Comparison, ascii_only: bool = False) -> str:
    lines = [str(move) for move in result.moves]
    if result.maps:
        lines.append(
            f"  GPUs before -> after, in the base's stack order ({MAP_LEGEND[ascii_only]}, "
            f"{MARKS[ascii_only][None]} not listed):"
        )
        width = max(len(node) for node in result.maps)
        lines += [f"    {node.ljust(width)}  {old} -> {new}" for node, (old, new) in result.maps.items()]
    lines += result.identity
    heads = {"removed": "- removed", "added": "+ added  ", "changed": "~ changed"}
    for name, change, fields, context in result.objects:
        lines.append(f"{heads[change]} {name}")
        lines += context + [f"    {path}: {_show(old)} -> {_show(new)}" for path, old, new in fields]
    return "\n".join(lines) if lines else NO_CHANGES


def as_json(result: Comparison) -> dict[str, Any]:
    """The comparison as data: field values as they are in the files, absent ones as null."""

    def value(item: Any) -> Any:
        return None if item is _ABSENT else item

    return {
        "changed": result.changed,
        "gpuMoves": [{"node": m.node, "uuid": m.uuid, "before": m.before, "after": m.after} for m in result.moves],
        "gpuMaps": {node: {"before": old, "after": new} for node, (old, new) in result.maps.items()},
        "identity": [line.strip() for line in result.identity],
        "objects": [
            {
                "file": name,
                "change": change,
                "fields": [{"path": path, "before": value(old), "after": value(new)} for path, old, new in fields],
                "notes": [line.strip() for line in context],
            }
            for name, change, fields, context in result.objects
        ],
    }


def diff(base_dir: Path, head_dir: Path) -> str:
    """The review text of two render directories (`no changes` when they are alike)."""
    return text(compare(base_dir, head_dir))


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.diff", __doc__)
    arguments.add_argument("base", type=Path, help="render directory of the base (e.g. main)")
    arguments.add_argument("head", type=Path, help="render directory of the change")
    arguments.add_argument("--exit-code", action="store_true", help="exit 1 when the renders differ")
    arguments.add_argument("--json", action="store_true", help="print the differences as JSON")
    args = arguments.parse_args(argv)

    def command() -> int:
        ascii_only = not can_print("".join(MARKS[False].values()))
        result = compare(args.base, args.head, ascii_only)
        if args.json:
            print(json.dumps(as_json(result), indent=1, default=str))
        else:
            print(text(result, ascii_only))
        return EXIT_FINDING if args.exit_code and result.changed else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
