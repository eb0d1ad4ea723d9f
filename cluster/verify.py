"""Does the cluster see only our GPUs? Checks a stack against the live API, by identity where it can.

    python -m cluster.verify --stack prod [--context C] [--kubeconfig K] [--json] [--deadline 120]

One LIST per kind for the whole stack (nodes, the pinned plugins and operands, the operator's plugins, GFD and
dcgm-exporter, stack records, RuntimeClasses, the guard's policies and bindings, quotas, hidden-gpu's DaemonSets,
ConfigMaps, ServiceAccounts, ClusterRoles and bindings, NetworkPolicies), whatever its size. Per
node: capacity and allocatable equal what the stack advertises, the operator switches are set, no operator plugin,
GFD or dcgm-exporter runs there, and exactly one pinned plugin (and one of each pinned operand) is Ready there whose
NVIDIA_VISIBLE_DEVICES is the stack's exposed UUIDs, in order, nothing in its pod reaching further (a container
privileged or given a capability, another one naming a GPU), and no other stack's record lists the node or its
GPUs. Stack-wide: the stack's own record, the RuntimeClasses (and no class the guard takes as plain with an NVIDIA
handler), each admission policy field by field (failure policy, matches, namespace selector, match conditions,
variables, rules), their bindings (the stack's mode, every namespace), the void policy if
`guard.addVoid` (its variables and mutation) and the quotas exist as the program declares them; the objects around
the plugins (each node's plugin DaemonSet and ConfigMap, pinned operands, DRA plugin and its identity, the plugin
namespace's NetworkPolicies, the RuntimeClasses) hold every field desired/ gives them, with
nothing added that could reach a GPU, and no other NetworkPolicy or ClusterRoleBinding widens them
(cluster/declared.py). DRA
(cluster/dra.py): no DeviceClass maps an NVIDIA resource name, the stack's DeviceClasses and their quotas are as
declared, and no ResourceSlice of a stack's node lists a hidden GPU a class tenants may use selects.
The cluster is the stack's own (`kubernetes:context`, `kubernetes:kubeconfig`) unless --context or
--kubeconfig say otherwise. Exit 1 on any mismatch, 2 on an invalid stack or kubeconfig, 3 when the
API server cannot be reached, refuses, or answers something malformed, 4 on an internal error.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cluster.admission_checks import check_guard_policy, check_node_switches, check_void_policy, same
from cluster.adoption import check_adoption
from cluster.declared import check_declared
from cluster.dra import check_dra
from cluster.kube import Reader, add_cluster_options, api_client
from cluster.leftovers import check_leftovers
from cluster.live import Check, Live
from cluster.metrics import usable, write_textfile
from common.cli import EXIT_FINDING, EXIT_OK, add_stack_source, format_table, parser, run, stack_file, stack_name_of
from common.names import (
    CDI_ANNOTATION_PATTERN,
    DRA_PLUGIN_IMAGE_NAMES,
    DRA_PLUGIN_NAME,
    GPU_RESOURCE,
    INSTANCE_LABEL,
    NO_GPU_VALUES,
    OPERANDS_OFF_ANNOTATION,
    OPERATOR_OPERAND_APPS,
    OPERATOR_PLUGIN_APP,
    PART_OF,
    PART_OF_LABEL,
    PINNED_OPERANDS,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    QUOTA_NAME,
    SHARED_NODE_TAINT,
    VISIBLE_DEVICES_ENV,
    Allocator,
    GuardScope,
)
from desired.device_plugin import added_capabilities
from desired.guard_rules import policy_specs
from desired.guard_settings import GuardSettings
from desired.node_labels import (
    gpu_device_classes,
    node_labels,
    operands_off,
    pinned_operands,
    quota_hard,
)
from desired.stack_claims import Claim
from stack_config import NodeConfig, StackConfig, parse_project_config, read_stack_file


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _visible_devices(pod: dict[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == VISIBLE_DEVICES_ENV:
                return str(env.get("value", ""))
    return "<unset>"


def _on(pods: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]


def _owner(pod: dict[str, Any]) -> str:
    """The pod's controller (the operator's DaemonSet), or the pod itself where none is named."""
    refs = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return f"{refs[0].get('kind')} {refs[0].get('name')}" if refs else f"Pod {pod['metadata'].get('name')}"


def _none_of_theirs(node: str, what: str, theirs: list[dict[str, Any]]) -> Check:
    """No pod of this kind (a GPU Operator operand, NVIDIA's own DRA plugin) on the node: the DaemonSets the ones
    found belong to are named."""
    owners = sorted({f"{p['metadata'].get('namespace')}/{_owner(p)}" for p in theirs})
    return Check(node, what, "0", f"{len(theirs)} ({', '.join(owners)})" if theirs else "0")


def _stock_dra_plugin(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(sign in str(c.get("image", "")) for c in containers for sign in DRA_PLUGIN_IMAGE_NAMES)


def _label(pod: dict[str, Any], key: str) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(key)


def _widened(pod: dict[str, Any], exposed: str, may_add: set[str]) -> Iterator[str]:
    """What in a pinned pod could reach more than its exposed GPUs, whatever its first container's variable says
    (that one is checked on its own): a container privileged or given a capability the render does not add (the
    toolkit treats SYS_ADMIN as privileged), another container whose NVIDIA_VISIBLE_DEVICES is neither `void` nor
    the exposed UUIDs (unset: the image's own `all`), variables from a ConfigMap or Secret, the host's PID or IPC
    namespace, a CDI device named by a pod annotation."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    first = (spec.get("containers") or [{}])[0]
    for container in [*containers, *(spec.get("ephemeralContainers") or [])]:
        name, security = container.get("name"), container.get("securityContext") or {}
        if security.get("privileged"):
            yield f"{name} privileged"
        if added := set((security.get("capabilities") or {}).get("add") or []) - may_add:
            yield f"{name} adds {','.join(sorted(added))}"
        if container.get("envFrom"):
            yield f"{name} envFrom"
        values = [
            e.get("value", "<valueFrom>") for e in container.get("env") or [] if e.get("name") == VISIBLE_DEVICES_ENV
        ]
        if container is not first and values[-1:] not in ([NO_GPU_VALUES[0]], [exposed]):
            yield f"{name} {VISIBLE_DEVICES_ENV}={values[-1] if values else '<unset: the image sees all>'}"
    yield from (f"{key}" for key in ("hostPID", "hostIPC") if spec.get(key))
    # A CDI device named by annotation reaches the runtime whatever the variables say.
    annotations = pod["metadata"].get("annotations") or {}
    yield from (f"annotation {key}" for key in sorted(annotations) if re.search(CDI_ANNOTATION_PATTERN, key))


def _pinned(node: NodeConfig, what: str, mine: list[dict[str, Any]], *, runs: bool | None = None) -> Iterator[Check]:
    """One Ready pod of the plugin (or a pinned operand) on the node where it runs, none elsewhere, and what it reads
    is exactly the exposed UUIDs, in order, with nothing that widens it."""
    runs = bool(node.exposed_gpus) if runs is None else runs
    yield Check(node.name, f"pinned {what} pods Ready", "1" if runs else "0", str(len([p for p in mine if _ready(p)])))
    if runs:
        exposed = ",".join(node.exposed_gpus)
        actual = ";".join(sorted({_visible_devices(p) for p in mine})) or f"<no {what} pod>"
        yield Check(node.name, f"{what} {VISIBLE_DEVICES_ENV}", exposed, actual)
        # The MIG monitor needs SYS_ADMIN in the plugin; nothing else adds any.
        may_add = set(added_capabilities(node)) if what == "plugin" else set()
        widened = [f"{p['metadata'].get('name')}: {found}" for p in mine for found in _widened(p, exposed, may_add)]
        yield Check(node.name, f"{what} pods: nothing wider", "none", "; ".join(widened) or "none")


def check_node(node: NodeConfig, live: Live) -> Iterator[Check]:
    found = live.nodes.get(node.name)
    if found is None:
        yield Check(node.name, "node exists", "yes", "no")
        return
    resource = f"{GPU_RESOURCE}.shared" if node.time_slicing and node.time_slicing.rename_by_default else GPU_RESOURCE
    status = found.get("status") or {}
    # Where DRA hands the GPUs out no plugin may advertise them; a plugin's capacity outlives it by the kubelet's
    # grace period (5 minutes), its allocatable drops at once.
    for kind in ("capacity", "allocatable") if node.allocator == Allocator.DEVICE_PLUGIN else ("allocatable",):
        yield Check(
            node.name, f"{kind} {resource}", str(node.advertised_gpus), str((status.get(kind) or {}).get(resource, "0"))
        )
    labels = (found.get("metadata") or {}).get("labels") or {}
    for label, value in node_labels(node).items():
        yield Check(node.name, f"label {label}", value, labels.get(label, "<unset>"))
    # The node-switches policy holds the node to this record: one that says less protects less.
    annotations = (found.get("metadata") or {}).get("annotations") or {}
    record = annotations.get(OPERANDS_OFF_ANNOTATION, "<unset>")
    yield Check(node.name, f"annotation {OPERANDS_OFF_ANNOTATION}", operands_off(node), record)
    # The operator's plugin, GFD and dcgm-exporter read every GPU: none may run on a stack node.
    theirs = _on(live.operator_pods, node.name)
    plugin_pods = [p for p in theirs if _label(p, "app") == OPERATOR_PLUGIN_APP]
    yield _none_of_theirs(node.name, "GPU Operator device-plugin pods", plugin_pods)
    for app in OPERATOR_OPERAND_APPS.values():
        yield _none_of_theirs(node.name, f"GPU Operator {app} pods", [p for p in theirs if _label(p, "app") == app])
    mine = [p for p in _on(live.pinned, node.name) if _label(p, INSTANCE_LABEL) == node.name]
    plugins = [p for p in mine if _label(p, PLUGIN_NAME_LABEL) == PLUGIN_NAME]
    yield from _pinned(node, "plugin", plugins, runs=node.runs_plugin)
    dra = node.allocator == Allocator.DRA and bool(node.exposed_gpus)
    kubelet_plugins = [p for p in mine if _label(p, PLUGIN_NAME_LABEL) == DRA_PLUGIN_NAME]
    if dra or kubelet_plugins:
        yield from _pinned(node, "DRA kubelet plugin", kubelet_plugins, runs=dra)
    # NVIDIA's own DRA kubelet plugin (its chart's, privileged) publishes every GPU of the node, hidden ones included.
    if (everyone := live.leftovers.get("pods")) is not None:
        stock = [p for p in _on(everyone, node.name) if _label(p, PART_OF_LABEL) != PART_OF and _stock_dra_plugin(p)]
        yield _none_of_theirs(node.name, "NVIDIA's own DRA kubelet plugin pods", stock)
    planned = pinned_operands(node)
    for operand in PINNED_OPERANDS.values():
        pods = [p for p in mine if _label(p, PLUGIN_NAME_LABEL) == operand]
        if operand in planned or pods:
            yield from _pinned(node, operand, pods, runs=operand in planned)
    yield from check_adoption(node, live)


def check_records(name: str, stack: StackConfig, live: Live) -> Iterator[Check]:
    """This stack's record is what it deploys, and no other stack in this cluster lists its nodes or GPUs:
    two plugins registering one resource on a node leave the kubelet with the later one's devices."""
    own = [r for r in live.records if r.stack == name]
    declared = Claim.declared(name, stack.nodes).nodes
    actual = "<missing>" if not own else same([dict(r.nodes) for r in own], [dict(declared)])
    yield Check("cluster", f"stack record {name}", "as declared", actual)
    others = [r for r in live.records if r.stack != name]
    for node in stack.nodes:
        claimed = {r.stack for r in others if r.lists(node.name)}
        gpus = {*node.exposed_gpus, *node.hidden_gpus}
        claimed |= {r.stack for r in others if gpus & set(r.gpus())}
        yield Check(node.name, "other stacks listing it or its GPUs", "none", ",".join(sorted(claimed)) or "none")


def check_stack(stack: StackConfig, live: Live) -> Iterator[Check]:
    for name in sorted(stack.guard.plain_runtime_classes):
        handler = str((live.runtime_classes.get(name) or {}).get("handler", "<missing>"))
        yield Check(
            "cluster",
            f"plain RuntimeClass {name}",
            "not NVIDIA's",
            handler if "nvidia" in handler.lower() else "not NVIDIA's",
        )
    args = GuardSettings.of(stack)
    if args.scope == GuardScope.SHARED_NODES:
        # The scope admits untouched what cannot reach these nodes: only their taint keeps such pods off them.
        for node in stack.nodes:
            taints = ((live.nodes.get(node.name) or {}).get("spec") or {}).get("taints") or []
            effects = {str(t.get("effect")) for t in taints if t.get("key") == SHARED_NODE_TAINT}
            missing = f"<none: kubectl taint node {node.name} {SHARED_NODE_TAINT}=true:NoSchedule>"
            actual = "NoSchedule" if "NoSchedule" in effects else ",".join(sorted(effects)) or missing
            yield Check(node.name, f"taint {SHARED_NODE_TAINT} (guard.scope sharedNodes)", "NoSchedule", actual)
    for declared in policy_specs(args):
        yield from check_guard_policy(declared, args, live)
    yield from check_node_switches(live)
    if live.leftovers:
        yield from check_leftovers(stack, live.leftovers)
    if args.add_void:
        yield from check_void_policy(live)
    classes = sorted(gpu_device_classes(stack))
    for namespace, limit in sorted(stack.quotas.items()):
        hard = ((live.quotas.get((namespace, QUOTA_NAME)) or {}).get("spec") or {}).get("hard") or {}
        for key, wanted in quota_hard(limit, classes).items():
            yield Check(namespace, f"ResourceQuota {key}", wanted, str(hard.get(key, "<missing>")))


def table(checks: list[Check]) -> str:
    rows = [("SCOPE", "CHECK", "EXPECTED", "ACTUAL", "")]
    rows += [(c.scope, c.what, c.expected, c.actual, "ok" if c.ok else "MISMATCH") for c in checks]
    return format_table(rows)


def main(argv: list[str] | None = None) -> int:
    arguments = parser("python -m cluster.verify", __doc__)
    add_stack_source(arguments)
    add_cluster_options(arguments)
    arguments.add_argument("--json", action="store_true", help="print the checks as JSON")
    arguments.add_argument("--deadline", type=float, default=120.0, help="seconds for the whole check (default 120)")
    arguments.add_argument(
        "--textfile",
        type=Path,
        help="also write the result as Prometheus metrics there, for node-exporter's textfile collector",
    )
    args = arguments.parse_args(argv)
    compared: list[list[Check]] = []

    def command() -> int:
        if args.textfile is not None:
            usable(args.textfile)
        path = stack_file(args)
        config = read_stack_file(path)
        stack = parse_project_config(config)
        reader = Reader(api_client(args, config), deadline=time.monotonic() + args.deadline)
        adopted = [(a.namespace, a.name) for n in stack.nodes if (a := n.adopt_device_plugin) is not None]
        shared = [(a.namespace, a.name) for n in stack.nodes if (a := n.shared_plugin) is not None]
        live = Live.read(
            reader, stack.device_plugin.namespace, mutating=stack.guard.add_void, adopted=adopted, shared=shared
        )
        checks = [c for node in stack.nodes for c in check_node(node, live)] + list(check_stack(stack, live))
        checks += check_records(stack_name_of(path), stack, live)
        checks += [Check(*found) for found in check_dra(stack, live.device_classes, live.resource_slices)]
        checks += check_declared(stack, live.compared())
        failed = [c for c in checks if not c.ok]
        compared.append(checks)
        if args.json:
            payload = {"checks": [asdict(c) | {"ok": c.ok} for c in checks], "mismatches": len(failed)}
            print(json.dumps(payload | {"requests": reader.requests}, indent=2))
        else:
            print(table(checks))
            print(f"result: {len(failed)} mismatch(es) in {len(checks)} checks, {reader.requests} API requests")
        return EXIT_FINDING if failed else EXIT_OK

    status = run(command, args.debug)
    if args.textfile is None or not args.textfile.parent.is_dir() or args.textfile.is_dir():
        return status  # a --textfile refused was said once, by the command
    stack = args.stack or stack_name_of(Path(args.stack_file))
    checks = compared[0] if compared else None

    def write() -> int:
        write_textfile(args.textfile, stack, status, checks, time.time())
        return EXIT_OK

    written = run(write, args.debug)
    return status if status != EXIT_OK else written


if __name__ == "__main__":
    sys.exit(main())
