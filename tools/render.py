"""Render a stack's Kubernetes objects offline: python -m tools.render --stack dev --out DIR.

Runs the real Pulumi program under Pulumi's mocks (no CLI, no cluster) and writes every object
it would create as one YAML file, byte-identical across runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stack_config import (
    InvalidConfigError,
    StackConfig,
    find_stack_file,
    parse_project_config,
    quota_warnings,
    read_stack_file,
    stack_name_of,
)
from tools.cli import EXIT_OK, EXIT_USAGE, UsageError, format_table, print_errors
from tools.program import Declared, ProgramRun, run_program

NODE_COMPONENT = "hidden-gpu:index:HiddenGpuNode"


@dataclass(frozen=True)
class Rendered:
    stack_name: str
    stack: StackConfig
    run: ProgramRun
    files: dict[str, dict[str, Any]]


def file_name(resource: Declared) -> str:
    """kind[.namespace].name.yaml: unique, because Kubernetes keeps those unique too."""
    kind = resource.type.rsplit(":", 1)[-1].lower()
    metadata = resource.inputs.get("metadata", {})
    parts = [kind, metadata.get("namespace"), metadata.get("name", resource.name)]
    return ".".join(part for part in parts if part) + ".yaml"


def render(stack_file: Path) -> Rendered:
    config = read_stack_file(stack_file)
    stack = parse_project_config(config)
    stack_name = stack_name_of(stack_file)
    run = run_program(config, stack_name)
    files = {file_name(resource): resource.inputs for resource in run.kubernetes_objects}
    return Rendered(stack_name, stack, run, files)


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, width=120)


def write(rendered: Rendered, out_dir: Path) -> None:
    """Replace out_dir with exactly the rendered objects, or leave it untouched on failure."""
    if out_dir.exists() and (
        not out_dir.is_dir() or any(not p.name.endswith(".yaml") or p.is_dir() for p in out_dir.iterdir())
    ):
        raise UsageError(f"--out {out_dir}: exists and is not a render directory; choose another")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, obj in rendered.files.items():
            (staging / name).write_text(to_yaml(obj), encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def summary(rendered: Rendered, out_dir: Path) -> str:
    components = {r.name: r.urn for r in rendered.run.of_type(NODE_COMPONENT)}
    # Counted once: kubernetes_objects sorts on every access, and a fleet has thousands of nodes.
    objects_of = Counter(r.parent for r in rendered.run.kubernetes_objects)
    rows: list[tuple[str, ...]] = [("node", "exposed", "advertised", "hidden", "objects")]
    for node in rendered.stack.nodes:
        owned = objects_of[components[node.name]]
        counts = (len(node.exposed_gpus), node.advertised_gpus, len(node.hidden_gpus), owned)
        rows.append((node.name, *map(str, counts)))
    lines = [
        f"stack {rendered.stack_name}: {len(rendered.files)} objects written to {out_dir}",
        format_table(rows, "  "),
    ]
    quotas = ", ".join(f"{ns}={limit}" for ns, limit in sorted(rendered.stack.quotas.items())) or "none"
    lines.append(f"  quotas (requests.nvidia.com/gpu): {quotas}")
    lines += [f"warning: {warning}" for warning in quota_warnings(rendered.stack)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.render", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="stack name: reads stacks/Pulumi.<stack>.yaml")
    source.add_argument("--stack-file", type=Path, help="any Pulumi stack file")
    parser.add_argument("--out", type=Path, required=True, help="directory to write (replaced whole)")
    args = parser.parse_args(argv)
    try:
        stack_file = args.stack_file or find_stack_file(args.stack)
        rendered = render(stack_file)
        write(rendered, args.out)
    except (InvalidConfigError, UsageError) as error:
        print_errors(str(error))
        return EXIT_USAGE
    print(summary(rendered, args.out))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
