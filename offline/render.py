"""Render a stack's Kubernetes objects offline: python -m offline.render --stack dev --out DIR.

Runs the real Pulumi program under Pulumi's mocks (no CLI, no cluster) and writes every object
it would create as one YAML file, byte-identical across runs.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.cli import (
    EXIT_OK,
    add_stack_source,
    can_print,
    captured_log,
    format_table,
    parser,
    run,
    stack_file,
    stack_name_of,
)
from common.names import GRAPH_FILE, PROJECT
from common.tokens import Token
from offline.diff import MAP_LEGEND, gpu_marks
from offline.outdir import replace_directory
from offline.program import Declared, ProgramRun, run_program
from stack_config import InvalidConfigError, StackConfig, parse_project_config, read_stack_file
from stack_config.reviewed import project_config_problems

PROJECT_DIR = Path(__file__).resolve().parent.parent
ROOT_STACK_TYPE = "pulumi:pulumi:Stack"
GRAPH_ABOUT = (
    "Not a Kubernetes object: what `pulumi up` would register, by URN, with its options, and which GPUs each "
    "node exposes and hides (written by offline.render, read by offline.diff)."
)


@dataclass(frozen=True)
class Rendered:
    stack_name: str
    stack: StackConfig
    run: ProgramRun
    files: dict[str, dict[str, Any]]
    environments: tuple[str, ...] = ()
    # What the program warned (pulumi.log.warn: `up` shows the same), printed once in the summary.
    warnings: list[str] = field(default_factory=list)


def file_name(resource: Declared) -> str:
    """kind[.namespace].name.yaml: unique, because Kubernetes keeps those unique too."""
    kind = resource.type.rsplit(":", 1)[-1].lower()
    metadata = resource.inputs.get("metadata", {})
    parts = [kind, metadata.get("namespace"), metadata.get("name", resource.name)]
    return ".".join(part for part in parts if part) + ".yaml"


def render(path: Path) -> Rendered:
    config = read_stack_file(path)
    # A default Pulumi.yaml gives every stack is applied by `up` (and refused there): refuse it here too.
    problems = project_config_problems(PROJECT_DIR)
    if problems:
        raise InvalidConfigError(problems)
    # Validated here too, before the program runs: an invalid stack exits 2 with every problem.
    stack = parse_project_config(config)
    stack_name = stack_name_of(path)
    # Pulumi's mock engine hands the program's warnings to the root logger, which would print them bare.
    with captured_log(logging.WARNING) as records:
        run_ = run_program(config, stack_name)
    files = {file_name(resource): resource.inputs for resource in run_.kubernetes_objects}
    warnings = [record.getMessage() for record in records]
    return Rendered(stack_name, stack, run_, files, config.environments, warnings)


def engine_urn(urn: str) -> str:
    """A URN as the Pulumi engine makes it: Pulumi's mocks put the root stack's type in front of a top-level
    resource's types (`pulumi:pulumi:Stack$...`), the engine leaves it out (resource.NewURN)."""
    return urn.replace(f"::{ROOT_STACK_TYPE}$", "::", 1)


def graph(rendered: Rendered) -> dict[str, Any]:
    """What `pulumi up` would register, by identity: each resource's URN, parent, provider, options and
    sorted dependencies (and, for a Kubernetes object, its file here); and each node's GPUs by role. A
    changed URN is a delete and a create for Pulumi, which the objects alone cannot show."""
    files = {resource.urn: file_name(resource) for resource in rendered.run.kubernetes_objects}
    resources = []
    for resource in sorted(rendered.run.resources, key=lambda r: engine_urn(r.urn)):
        entry: dict[str, Any] = {"urn": engine_urn(resource.urn)}
        if resource.urn in files:
            entry["file"] = files[resource.urn]
        if resource.parent and resource.parent.split("::")[2] != ROOT_STACK_TYPE:  # top-level: no parent
            entry["parent"] = engine_urn(resource.parent)
        if resource.provider:
            entry["provider"] = engine_urn(resource.provider.rsplit("::", 1)[0])
        entry["retainOnDelete"] = resource.retain_on_delete
        entry["protect"] = resource.protect
        entry["dependsOn"] = sorted(engine_urn(d) for d in resource.dependencies)
        if resource.aliases:
            entry["aliases"] = sorted(engine_urn(a) for a in resource.aliases)
        resources.append(entry)
    return {"gpus": graph_gpus(rendered), "resources": resources}


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, width=120)


def summary_data(rendered: Rendered, out_dir: Path) -> dict[str, Any]:
    """What the summary says, as data (`--json`): read from what the program exported and the objects it
    declared, and each node's GPUs by role in stack order (hidden ones included, as in the graph file)."""
    exported: dict[str, dict[str, Any]] = rendered.run.outputs["nodes"]
    components = {r.name: r.urn for r in rendered.run.of_type(Token.HIDDEN_GPU_NODE)}
    # Counted once: kubernetes_objects sorts on every access, and a fleet has thousands of nodes.
    objects_of = Counter(r.parent for r in rendered.run.kubernetes_objects)
    gpus = graph_gpus(rendered)
    guard = rendered.stack.guard
    warnings = list(rendered.warnings)
    if rendered.environments:
        warnings.append(
            f"the stack imports ESC environments ({', '.join(rendered.environments)}) that this render "
            f"cannot read; `pulumi up` refuses any {PROJECT}: value they change"
        )
    return {
        "stack": rendered.stack_name,
        "out": str(out_dir),
        "objects": len(rendered.files),
        "nodes": [
            {
                "name": name,
                "exposed": node["exposedCount"],
                "advertised": node["advertisedCount"],
                "hidden": node["hiddenCount"],
                "objects": objects_of[components[name]],
                "gpus": gpus[name],
            }
            for name, node in exported.items()
        ],
        "quotas": dict(sorted(rendered.stack.quotas.items())),
        "guard": {
            "mode": str(guard.mode),
            "exemptNamespaces": list(rendered.stack.exempt_namespaces),
            "exemptNamespaceLabels": dict(sorted(guard.exempt_namespace_labels.items())),
            "addsVoid": guard.add_void,
        },
        "warnings": warnings,
    }


def summary(data: dict[str, Any], ascii_only: bool = False) -> str:
    """The summary as printed: the per-node table, quotas, guard, each node's GPUs one mark each, warnings."""
    rows: list[tuple[str, ...]] = [("node", "exposed", "advertised", "hidden", "objects")]
    rows += [(n["name"], *(str(n[k]) for k in ("exposed", "advertised", "hidden", "objects"))) for n in data["nodes"]]
    marks = [(n["name"], gpu_marks(n["gpus"], ascii_only=ascii_only)) for n in data["nodes"]]
    lines = [
        f"stack {data['stack']}: {data['objects']} objects written to {data['out']}",
        format_table(rows, "  "),
    ]
    quotas = ", ".join(f"{ns}={limit}" for ns, limit in data["quotas"].items()) or "none"
    lines.append(f"  quotas (requests.nvidia.com/gpu): {quotas}")
    guard = data["guard"]
    labels = ", ".join(f"{k}={v}" for k, v in guard["exemptNamespaceLabels"].items()) or "none"
    exempt = ", ".join(guard["exemptNamespaces"])
    adds_void = (
        "; adds NVIDIA_VISIBLE_DEVICES=void to new containers without a GPU request" if guard["addsVoid"] else ""
    )
    lines.append(f"  guard: {guard['mode']}; exempt namespaces: {exempt}; exempt by label: {labels}{adds_void}")
    # After the table, quotas and guard, which keep their lines; before the warnings, which end it.
    lines += [
        f"  GPUs in stack order ({MAP_LEGEND[ascii_only]}):",
        *(f"    {name.ljust(max(len(n) for n, _ in marks))}  {line}" for name, line in marks),
    ]
    lines += [f"warning: {warning}" for warning in data["warnings"]]
    return "\n".join(lines)


def graph_gpus(rendered: Rendered) -> dict[str, dict[str, list[str]]]:
    """Each node's GPUs by role, in stack order: what the graph file records and the GPU map shows."""
    return {
        node.name: {"exposed": list(node.exposed_gpus), "hidden": list(node.hidden_gpus)}
        for node in rendered.stack.nodes
    }


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.render", __doc__)
    add_stack_source(arguments)
    arguments.add_argument(
        "--out", type=Path, required=True, help="directory to write (a render directory, replaced whole)"
    )
    arguments.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = arguments.parse_args(argv)

    def command() -> int:
        path = stack_file(args)
        rendered = render(path)
        files = {name: to_yaml(obj) for name, obj in rendered.files.items()}
        files[GRAPH_FILE] = json.dumps({"about": GRAPH_ABOUT, **graph(rendered)}, indent=1) + "\n"
        replace_directory(args.out, files, keep=[path])
        data = summary_data(rendered, args.out)
        print(json.dumps(data, indent=1) if args.json else summary(data, not can_print("■□")))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
