"""Per-object, per-field difference between two render directories.

    python -m tools.diff BASE_DIR HEAD_DIR

What a reviewer needs from a change to which GPUs a cluster may touch: which objects appear,
disappear or change, and for a change, which fields, with old and new values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from tools.cli import EXIT_OK, EXIT_USAGE, print_errors

_ABSENT = object()


def _load(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a directory")
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.yaml"))}


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


def diff(base_dir: Path, head_dir: Path) -> str:
    base, head = _load(base_dir), _load(head_dir)
    lines = []
    for name in sorted(set(base) | set(head)):
        if name not in head:
            lines.append(f"- removed {name}")
        elif name not in base:
            lines.append(f"+ added   {name}")
        elif base[name] != head[name]:
            lines.append(f"~ changed {name}")
            lines += [
                f"    {field}: {_show(old)} -> {_show(new)}"
                for field, old, new in field_changes(base[name], head[name])
            ]
    return "\n".join(lines) if lines else "no changes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.diff", description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="render directory of the base (e.g. main)")
    parser.add_argument("head", type=Path, help="render directory of the change")
    args = parser.parse_args(argv)
    try:
        print(diff(args.base, args.head))
    except FileNotFoundError as error:
        print_errors(str(error))
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
