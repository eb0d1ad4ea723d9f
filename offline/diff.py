"""Per-object, per-field difference between two render directories, identity first.

    python -m offline.diff BASE_DIR HEAD_DIR [--exit-code]

What a reviewer needs from a change to which GPUs a cluster may touch, in this order: every GPU UUID
that moved between exposed and hidden (one line each, per node, hidden ones included); every resource
whose Pulumi identity changes (a URN changed without an alias is a delete and a create) or whose options
change (retainOnDelete, protect, parent, provider, dependencies); then which objects appear, disappear
or change, field by field. An added or removed device plugin names its node and the UUIDs it exposes;
a node that leaves the stack is flagged. With --exit-code the status is 1 when the renders differ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from common.cli import EXIT_FINDING, EXIT_OK, UsageError, parser, run
from common.names import GRAPH_FILE, INSTANCE_LABEL, VISIBLE_DEVICES_ENV

_ABSENT = object()
NO_CHANGES = "no changes"


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UsageError(f"{path}: cannot read a rendered file ({type(error).__name__})") from None


def _load(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
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


def gpu_moves(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """One line per GPU whose role on its node changed, hidden ones included (they are in no object)."""
    lines = []
    old_nodes, new_nodes = base.get("gpus") or {}, head.get("gpus") or {}
    for node in sorted(set(old_nodes) | set(new_nodes)):
        old = {u: role for role, uuids in (old_nodes.get(node) or {}).items() for u in uuids}
        new = {u: role for role, uuids in (new_nodes.get(node) or {}).items() for u in uuids}
        for uuid in sorted(set(old) | set(new)):
            if old.get(uuid) != new.get(uuid):
                lines.append(
                    f"! node {node}: {uuid} {old.get(uuid, '(not listed)')} -> {new.get(uuid, '(not listed)')}"
                )
    return lines


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


def diff(base_dir: Path, head_dir: Path) -> str:
    base, head = _load(base_dir), _load(head_dir)
    base_graph, head_graph = _graph(base_dir), _graph(head_dir)
    if base_graph and head_graph:
        lines = gpu_moves(base_graph, head_graph) + identity_changes(base_graph, head_graph)
    elif base_graph or head_graph:  # a render from before the graph existed: nothing to compare it with
        lines = [f"  ({'base' if not base_graph else 'head'} render has no {GRAPH_FILE}: identity not compared)"]
    else:
        lines = []
    for name in sorted(set(base) | set(head)):
        if name not in head:
            lines.append(f"- removed {name}")
            lines += _context(base[name], removed=True)
        elif name not in base:
            lines.append(f"+ added   {name}")
            lines += _context(head[name], removed=False)
        elif base[name] != head[name]:
            lines.append(f"~ changed {name}")
            lines += [
                f"    {field}: {_show(old)} -> {_show(new)}"
                for field, old, new in field_changes(base[name], head[name])
            ]
    return "\n".join(lines) if lines else NO_CHANGES


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.diff", __doc__)
    arguments.add_argument("base", type=Path, help="render directory of the base (e.g. main)")
    arguments.add_argument("head", type=Path, help="render directory of the change")
    arguments.add_argument("--exit-code", action="store_true", help="exit 1 when the renders differ")
    args = arguments.parse_args(argv)

    def command() -> int:
        text = diff(args.base, args.head)
        print(text)
        return EXIT_FINDING if args.exit_code and text != NO_CHANGES else EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
