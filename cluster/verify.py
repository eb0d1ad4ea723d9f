"""Does the cluster see only our GPUs? Checks a stack against the live API, by identity where it can.

    python -m cluster.verify --stack prod [--context C] [--kubeconfig K] [--json] [--deadline 120]

One LIST per kind for the whole stack (nodes, the pinned plugins, the operator's plugins, stack records,
RuntimeClasses, the guard's policies and bindings, quotas), whatever its size. Per node: capacity
and allocatable equal what the stack advertises, the operator switches are set, no operator plugin
runs there, and exactly one pinned plugin is Ready there whose NVIDIA_VISIBLE_DEVICES is the
stack's exposed UUIDs, in order, and no other stack's record lists the node or its GPUs. Stack-wide:
the stack's own record, the RuntimeClasses (and no class the guard takes as plain with an NVIDIA
handler), both admission policies field by field (failure policy, matches, exemptions, variables,
rules), their bindings (the stack's mode, every namespace), the void policy if
`guard.addVoid` (its variables and mutation) and the quotas exist as the program declares them. DRA
(cluster/dra.py): no DeviceClass maps an NVIDIA resource name, the stack's DeviceClasses and their quotas are as
declared, and no ResourceSlice of a stack's node lists a hidden GPU a class tenants may use selects.
The cluster is the stack's own (`kubernetes:context`, `kubernetes:kubeconfig`) unless --context or
--kubeconfig say otherwise. Exit 1 on any mismatch, 2 on an invalid stack or kubeconfig, 3 when the
API server cannot be reached, refuses, or answers something malformed, 4 on an internal error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster.dra import check_dra
from cluster.kube import Reader, add_cluster_options, api_client
from cluster.metrics import usable, write_textfile
from common.cli import EXIT_FINDING, EXIT_OK, add_stack_source, format_table, parser, run, stack_file, stack_name_of
from common.names import (
    DRA_API_PATH,
    FIELD_MANAGER,
    GPU_RESOURCE,
    INSTANCE_LABEL,
    NVIDIA_RUNTIME_HANDLER,
    OPERATOR_PLUGIN_SELECTOR,
    PART_OF,
    PART_OF_LABEL,
    PLUGIN_NAME,
    PLUGIN_NAME_LABEL,
    QUOTA_NAME,
    STACK_LABEL,
    VISIBLE_DEVICES_ENV,
    VOID_POLICY_NAME,
)
from components.guard_rules import (
    NOT_EXEMPT,
    VALIDATION_ACTIONS,
    GuardSettings,
    PolicySpec,
    exemption,
    namespace_selector,
    policy_specs,
    void_mutation,
    void_variables,
)
from components.node_labels import gpu_device_classes, node_labels, quota_hard, runtime_class_of
from components.stack_claims import Claim
from stack_config import NodeConfig, StackConfig, parse_project_config, read_stack_file

OURS = f"{PART_OF_LABEL}={PART_OF}"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class Check:
    scope: str
    what: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


@dataclass(frozen=True)
class Live:
    """The cluster as one LIST per kind returned it."""

    nodes: dict[str, dict[str, Any]]
    pinned: list[dict[str, Any]]
    operator_plugins: list[dict[str, Any]]
    runtime_classes: dict[str, dict[str, Any]]
    policies: dict[str, dict[str, Any]]
    bindings: dict[str, dict[str, Any]]
    quotas: dict[tuple[str, str], dict[str, Any]]
    # Read only for a stack that declares them: older API servers do not serve the kind.
    mutating_policies: dict[str, dict[str, Any]]
    mutating_bindings: dict[str, dict[str, Any]]
    # Every stack's record in this cluster, whatever its namespace.
    records: list[Claim]
    # Every DeviceClass and ResourceSlice (resource.k8s.io/v1, GA since Kubernetes 1.34): cluster/dra.py.
    device_classes: dict[str, dict[str, Any]]
    resource_slices: list[dict[str, Any]]
    # The DaemonSets taken over from a hand-made setup (nodes[].adoptDevicePlugin), by (namespace, name).
    adopted: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)

    @classmethod
    def read(
        cls, reader: Reader, plugin_namespace: str, *, mutating: bool = False, adopted: Iterable[tuple[str, str]] = ()
    ) -> Live:
        def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
            return {i["metadata"].get("name", ""): i for i in items}

        taken_over = sorted(set(adopted))
        # An adopted plugin's pods stay in its own namespace, labelled as ours are.
        namespaces = sorted({plugin_namespace, *(namespace for namespace, _ in taken_over)})
        return cls(
            nodes=by_name(reader.list("/api/v1/nodes")),
            pinned=[
                pod
                for namespace in namespaces
                for pod in reader.list(
                    f"/api/v1/namespaces/{namespace}/pods", f"{OURS},{PLUGIN_NAME_LABEL}={PLUGIN_NAME}"
                )
            ],
            operator_plugins=reader.list("/api/v1/pods", OPERATOR_PLUGIN_SELECTOR),
            # Every class, not only ours: the guard judges a class as NVIDIA's unless the stack lists it as plain.
            runtime_classes=by_name(reader.list("/apis/node.k8s.io/v1/runtimeclasses")),
            policies=by_name(reader.list(f"{ADMISSION}/validatingadmissionpolicies", OURS)),
            bindings=by_name(reader.list(f"{ADMISSION}/validatingadmissionpolicybindings", OURS)),
            quotas={
                (q["metadata"].get("namespace", ""), q["metadata"].get("name", "")): q
                for q in reader.list("/api/v1/resourcequotas", OURS)
            },
            mutating_policies=by_name(reader.list(f"{ADMISSION}/mutatingadmissionpolicies", OURS)) if mutating else {},
            mutating_bindings=(
                by_name(reader.list(f"{ADMISSION}/mutatingadmissionpolicybindings", OURS)) if mutating else {}
            ),
            records=[Claim.of(c) for c in reader.list("/api/v1/configmaps", STACK_LABEL)],
            device_classes=by_name(reader.list(f"{DRA_API_PATH}/deviceclasses")),
            resource_slices=reader.list(f"{DRA_API_PATH}/resourceslices"),
            adopted={
                (namespace, name): reader.find(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
                for namespace, name in taken_over
            },
        )


def _owned(fields: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field path a managedFields entry's fieldsV1 owns (a key with `.` owns the element itself)."""
    for key, below in fields.items():
        if key == ".":
            yield prefix
        elif isinstance(below, dict) and below:
            yield from _owned(below, (*prefix, key))
        else:
            yield (*prefix, key)


def leftover_fields(daemon_set: dict[str, Any]) -> list[str]:
    """The DaemonSet's spec fields that only another manager owns (the hand-made manager's, which a forced apply by
    hidden-gpu left because hidden-gpu does not declare them): the takeover has not converged them."""
    ours: set[tuple[str, ...]] = set()
    theirs: set[tuple[str, ...]] = set()
    for entry in (daemon_set.get("metadata") or {}).get("managedFields") or []:
        if entry.get("subresource"):  # status, written by the controller
            continue
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        paths = {("f:spec", *path) for path in _owned(spec)}
        (ours if entry.get("manager") == FIELD_MANAGER else theirs).update(paths)
    # Converged: a path ours owns too, or one above a path of ours (a list element whose fields ours sets).
    left = {p for p in theirs - ours if not any(o[: len(p)] == p for o in ours)}
    # One line per leftover: an element's own fields go with it.
    top = [p for p in left if not any(q != p and p[: len(q)] == q for q in left)]
    return sorted(".".join(part.removeprefix("f:") for part in path) for path in top)


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


def check_node(node: NodeConfig, live: Live) -> Iterator[Check]:
    found = live.nodes.get(node.name)
    if found is None:
        yield Check(node.name, "node exists", "yes", "no")
        return
    resource = f"{GPU_RESOURCE}.shared" if node.time_slicing and node.time_slicing.rename_by_default else GPU_RESOURCE
    status = found.get("status") or {}
    for kind in ("capacity", "allocatable"):
        yield Check(
            node.name, f"{kind} {resource}", str(node.advertised_gpus), str((status.get(kind) or {}).get(resource, "0"))
        )
    labels = (found.get("metadata") or {}).get("labels") or {}
    for label, value in node_labels(node).items():
        yield Check(node.name, f"label {label}", value, labels.get(label, "<unset>"))
    yield Check(node.name, "GPU Operator device-plugin pods", "0", str(len(_on(live.operator_plugins, node.name))))
    mine = [
        p for p in _on(live.pinned, node.name) if (p["metadata"].get("labels") or {}).get(INSTANCE_LABEL) == node.name
    ]
    ready = [p for p in mine if _ready(p)]
    yield Check(node.name, "pinned plugin pods Ready", "1" if node.exposed_gpus else "0", str(len(ready)))
    if node.exposed_gpus:
        actual = ";".join(sorted({_visible_devices(p) for p in mine})) or "<no plugin pod>"
        yield Check(node.name, f"plugin {VISIBLE_DEVICES_ENV}", ",".join(node.exposed_gpus), actual)
    adopt = node.adopt_device_plugin
    if adopt is not None and node.exposed_gpus:
        found = live.adopted.get((adopt.namespace, adopt.name))
        left = "<missing>" if found is None else ", ".join(leftover_fields(found)) or "none"
        yield Check(node.name, f"adopted {adopt.namespace}/{adopt.name}: fields only its maker set", "none", left)


def check_records(name: str, stack: StackConfig, live: Live) -> Iterator[Check]:
    """This stack's record is what it deploys, and no other stack in this cluster lists its nodes or GPUs:
    two plugins registering one resource on a node leave the kubelet with the later one's devices."""
    own = [r for r in live.records if r.stack == name]
    declared = Claim.declared(name, stack.nodes).nodes
    actual = "<missing>" if not own else _same([dict(r.nodes) for r in own], [dict(declared)])
    yield Check("cluster", f"stack record {name}", "as declared", actual)
    others = [r for r in live.records if r.stack != name]
    for node in stack.nodes:
        claimed = {r.stack for r in others if r.lists(node.name)}
        gpus = {*node.exposed_gpus, *node.hidden_gpus}
        claimed |= {r.stack for r in others if gpus & set(r.gpus())}
        yield Check(node.name, "other stacks listing it or its GPUs", "none", ",".join(sorted(claimed)) or "none")


def check_stack(stack: StackConfig, live: Live) -> Iterator[Check]:
    for name, label, value in sorted({runtime_class_of(n) for n in stack.nodes if n.exposed_gpus}):
        found = live.runtime_classes.get(name)
        selector = ((found or {}).get("scheduling") or {}).get("nodeSelector") or {}
        actual = f"{found.get('handler')} on {label}={selector.get(label)}" if found else "<missing>"
        yield Check("cluster", f"RuntimeClass {name}", f"{NVIDIA_RUNTIME_HANDLER} on {label}={value}", actual)
    for name in sorted(stack.guard.plain_runtime_classes):
        handler = str((live.runtime_classes.get(name) or {}).get("handler", "<missing>"))
        yield Check(
            "cluster",
            f"plain RuntimeClass {name}",
            "not NVIDIA's",
            handler if "nvidia" in handler.lower() else "not NVIDIA's",
        )
    args = GuardSettings.of(stack)
    for declared in policy_specs(args):
        yield from _check_guard_policy(declared, args, live)
    if args.add_void:
        yield from _check_void_policy(live)
    classes = sorted(gpu_device_classes(stack))
    for namespace, limit in sorted(stack.quotas.items()):
        hard = ((live.quotas.get((namespace, QUOTA_NAME)) or {}).get("spec") or {}).get("hard") or {}
        for key, wanted in quota_hard(limit, classes).items():
            yield Check(namespace, f"ResourceQuota {key}", wanted, str(hard.get(key, "<missing>")))


def _check_guard_policy(declared: PolicySpec, args: GuardSettings, live: Live) -> Iterator[Check]:
    """Every field of the policy and its binding that decides what is judged and what a failure does: a
    policy that fails open, matches other requests, exempts more namespaces, or a binding that warns or
    binds fewer namespaces, each named."""
    policy = live.policies.get(declared.name)
    what = f"ValidatingAdmissionPolicy {declared.name}"
    if policy is None:
        yield Check("cluster", what, "as declared", "<missing>")
    else:
        spec = policy.get("spec") or {}
        constraints = spec.get("matchConstraints") or {}
        rules_live = [
            {key: rule.get(key) for key in ("apiGroups", "apiVersions", "operations", "resources")}
            for rule in constraints.get("resourceRules") or []
        ]
        # The API server defaults an absent selector to {} (every namespace).
        selector = constraints.get("namespaceSelector") or None
        conditions = {c.get("name"): c.get("expression") for c in spec.get("matchConditions") or []}
        live_variables = [(v.get("name"), v.get("expression")) for v in spec.get("variables") or []]
        live_rules = [v.get("expression") for v in spec.get("validations") or []]
        fields = (
            ("failurePolicy", "Fail", str(spec.get("failurePolicy"))),
            ("matches", "as declared", _same(rules_live, [declared.match])),
            ("exemptions", "as declared", _same(conditions, {NOT_EXEMPT: f"!({exemption(args)})"})),
            ("namespaceSelector", "as declared", _same(selector, namespace_selector(args))),
            ("variables", "as declared", _same(live_variables, declared.variables)),
            ("rules", "as declared", _same(live_rules, [r.expression for r in declared.rules])),
        )
        for field, expected, actual in fields:
            yield Check("cluster", f"{what} {field}", expected, actual)
    binding = live.bindings.get(declared.name)
    spec = (binding or {}).get("spec") or {}
    actions = spec.get("validationActions")
    yield Check(
        "cluster",
        f"binding {declared.name} actions",
        ",".join(VALIDATION_ACTIONS[args.mode]),
        ",".join(actions) if actions else "<missing>",
    )
    # A binding without matchResources applies wherever the policy matches; any selector narrows it.
    scope = {k: v for k, v in (spec.get("matchResources") or {}).items() if v not in ({}, None, "Equivalent")}
    bound = (
        "<missing>"
        if binding is None
        else ("every namespace" if not scope and not spec.get("paramRef") else "narrowed")
    )
    yield Check("cluster", f"binding {declared.name} scope", "every namespace", bound)


def _same(live: object, declared: object) -> str:
    return "as declared" if live == declared else "differs"


def _check_void_policy(live: Live) -> Iterator[Check]:
    policy = live.mutating_policies.get(VOID_POLICY_NAME)
    spec = (policy or {}).get("spec") or {}
    declared = [(v.get("name"), v.get("expression")) for v in spec.get("variables") or []] == void_variables() and [
        (m.get("applyConfiguration") or {}).get("expression") for m in spec.get("mutations") or []
    ] == [void_mutation()]
    actual = "as declared" if declared else ("<missing>" if policy is None else "mutation differs")
    yield Check("cluster", f"MutatingAdmissionPolicy {VOID_POLICY_NAME}", "as declared", actual)
    binding = live.mutating_bindings.get(VOID_POLICY_NAME)
    bound = ((binding or {}).get("spec") or {}).get("policyName")
    yield Check("cluster", f"binding {VOID_POLICY_NAME} policy", VOID_POLICY_NAME, bound or "<missing>")


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
        live = Live.read(reader, stack.device_plugin.namespace, mutating=stack.guard.add_void, adopted=adopted)
        checks = [c for node in stack.nodes for c in check_node(node, live)] + list(check_stack(stack, live))
        checks += check_records(stack_name_of(path), stack, live)
        checks += [Check(*found) for found in check_dra(stack, live.device_classes, live.resource_slices)]
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
