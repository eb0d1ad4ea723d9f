"""Render a stack's Kubernetes objects offline: python -m offline.render --stack dev --out DIR.

Runs the real Pulumi program under Pulumi's mocks (no CLI, no cluster) and writes every object
it would create as one YAML file, byte-identical across runs.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.cli import EXIT_OK, add_stack_source, format_table, parser, run, stack_file, stack_name_of
from common.names import GRAPH_FILE, PROJECT, Token
from offline.outdir import replace_directory
from offline.program import Declared, ProgramRun, run_program
from stack_config import InvalidConfigError, StackConfig, parse_project_config, quota_warnings, read_stack_file
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
    run_ = run_program(config, stack_name)
    files = {file_name(resource): resource.inputs for resource in run_.kubernetes_objects}
    return Rendered(stack_name, stack, run_, files, config.environments)


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
    gpus = {
        node.name: {"exposed": list(node.exposed_gpus), "hidden": list(node.hidden_gpus)}
        for node in rendered.stack.nodes
    }
    return {"gpus": gpus, "resources": resources}


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, width=120)


def summary(rendered: Rendered, out_dir: Path) -> str:
    """The per-node table, read from what the program exported and the objects it declared."""
    exported: dict[str, dict[str, Any]] = rendered.run.outputs["nodes"]
    components = {r.name: r.urn for r in rendered.run.of_type(Token.HIDDEN_GPU_NODE)}
    # Counted once: kubernetes_objects sorts on every access, and a fleet has thousands of nodes.
    objects_of = Counter(r.parent for r in rendered.run.kubernetes_objects)
    rows: list[tuple[str, ...]] = [("node", "exposed", "advertised", "hidden", "objects")]
    for name, node in exported.items():
        counts = (node["exposedCount"], node["advertisedCount"], node["hiddenCount"], objects_of[components[name]])
        rows.append((name, *map(str, counts)))
    lines = [
        f"stack {rendered.stack_name}: {len(rendered.files)} objects written to {out_dir}",
        format_table(rows, "  "),
    ]
    quotas = ", ".join(f"{ns}={limit}" for ns, limit in sorted(rendered.stack.quotas.items())) or "none"
    lines.append(f"  quotas (requests.nvidia.com/gpu): {quotas}")
    guard = rendered.stack.guard
    labels = ", ".join(f"{k}={v}" for k, v in sorted(guard.exempt_namespace_labels.items())) or "none"
    exempt = ", ".join(rendered.stack.exempt_namespaces)
    adds_void = "; adds NVIDIA_VISIBLE_DEVICES=void to new containers without a GPU request" if guard.add_void else ""
    lines.append(f"  guard: {guard.mode}; exempt namespaces: {exempt}; exempt by label: {labels}{adds_void}")
    lines += [f"warning: {warning}" for warning in quota_warnings(rendered.stack)]
    if rendered.environments:
        lines.append(
            f"warning: the stack imports ESC environments ({', '.join(rendered.environments)}) that this render "
            f"cannot read; `pulumi up` refuses any {PROJECT}: value they add"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m offline.render", __doc__)
    add_stack_source(arguments)
    arguments.add_argument(
        "--out", type=Path, required=True, help="directory to write (a render directory, replaced whole)"
    )
    args = arguments.parse_args(argv)

    def command() -> int:
        path = stack_file(args)
        rendered = render(path)
        files = {name: to_yaml(obj) for name, obj in rendered.files.items()}
        files[GRAPH_FILE] = json.dumps({"about": GRAPH_ABOUT, **graph(rendered)}, indent=1) + "\n"
        replace_directory(args.out, files, keep=[path])
        print(summary(rendered, args.out))
        return EXIT_OK

    return run(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
