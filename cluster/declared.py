"""The objects the stack declares around its plugins, live against desired/: each node's plugin DaemonSet and its
ConfigMap, the pinned operands, the DRA plugin and its identity, the plugin namespace's NetworkPolicies, the
RuntimeClasses; and nothing beside them that widens them.

Every field the stack sets must hold its value (the API server's defaults beside them are fine), a list of named
items (containers, init containers, volumes, mounts, variables) must name exactly the stack's, in its order, and
what the API server never defaults is compared whole (EXACT) or must stay unset where the stack leaves it out
(UNSET): a volume, a capability or an egress rule added by hand is what could reach a hidden GPU or carry it out,
and `up` would not take it away."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from cluster.live import Check
from common.names import PROVIDER_ANNOTATION_PREFIX, Allocator, dra_plugin_name
from desired.device_plugin import plugin_objects
from desired.dra_plugin import dra_plugin_objects
from desired.node_labels import pinned_operands
from desired.operands import operand_objects
from desired.plugin_namespace import network_policies
from desired.pods import Object, runtime_classes
from stack_config.models import DraConfig, StackConfig
from stack_config.node_config import NodeConfig

# What a difference shows of a live value: enough to recognise it.
SHOWN = 80
Key = tuple[str, str, str]
# Compared whole: what the stack states of them is the live value, no more (desired/ states each as the API server
# stores it: ConfigMap `data`, `policyTypes`, a subject's or roleRef's apiGroup are defaulted only where left out).
EXACT = frozenset(
    {"securityContext", "data", "rules", "roleRef", "subjects", "podSelector", "policyTypes", "ingress", "egress"}
)
# Fields whose absence is what the stack declares, none of which the API server defaults (k8s.io/kubernetes v1.37.2
# pkg/apis/core/v1/defaults.go:82-100, :243-273, read): no host namespace or port, no variables from elsewhere, no
# container, command, claim, device or node beyond the stack's, no mount propagation, no traffic.
UNSET = frozenset(
    {
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostPort",
        "shareProcessNamespace",
        "ephemeralContainers",
        "initContainers",
        "command",
        "args",
        "envFrom",
        "resourceClaims",
        "volumeDevices",
        "mountPropagation",
        "nodeName",
        "ingress",
        "egress",
    }
)
# `kubectl rollout restart` writes it into a pod template: the one annotation there the stack does not state.
ROLL_ANNOTATION = "kubectl.kubernetes.io/restartedAt"
# The client's parser of `500m`, `1Gi`: the API server's own rules.
_quantity: Callable[[object], Decimal] = parse_quantity


def key_of(obj: Object) -> Key:
    metadata = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def _shown(value: object) -> str:
    text = "<unset>" if value is None else str(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}..."


def _same_scalar(path: str, desired: object, live: object) -> bool:
    if desired == live:
        return True
    # Quantities come back canonical (`1000m` as `1`): the same amount is the same request.
    if ".resources." in f".{path}." and isinstance(live, str | int) and isinstance(desired, str | int):
        try:
            return _quantity(desired) == _quantity(live)
        except ValueError:
            return False
    return False


def _names(items: list[Any]) -> list[str] | None:
    names = [name for item in items if isinstance(item, dict) and isinstance(name := item.get("name"), str)]
    return names if len(names) == len(items) else None


def differences(desired: object, live: object, path: str = "") -> Iterator[str]:
    """Where the live value is not what the stack declares, by field path."""
    if isinstance(desired, dict):
        yield from _object_differences(desired, live, path)
    elif isinstance(desired, list):
        yield from _list_differences(desired, live, path)
    elif not _same_scalar(path, desired, live):
        yield f"{path} {_shown(live)}"


def _object_differences(desired: dict[str, Any], live: object, path: str) -> Iterator[str]:
    if not isinstance(live, dict):
        yield f"{path or 'object'} {_shown(live)}"
        return
    for key, value in desired.items():
        where = f"{path}.{key}" if path else key
        if key not in EXACT:
            yield from differences(value, live.get(key), where)
        elif value != live.get(key):
            yield f"{where} {_shown(live.get(key))}"
    for key in sorted(UNSET & live.keys() - desired.keys()):
        if live[key]:
            yield f"{path}.{key} {_shown(live[key])}"


def _list_differences(desired: list[Any], live: object, path: str) -> Iterator[str]:
    if not isinstance(live, list):
        yield f"{path} {_shown(live)}"
        return
    wanted, found = _names(desired), _names(live)
    if wanted is not None and (found is not None or not live):
        if wanted != (found or []):
            yield f"{path} names {','.join(found or []) or '<none>'}"
            return
        labels: list[str] = wanted
    elif len(desired) != len(live):
        yield f"{path} has {len(live)} items"
        return
    else:
        labels = [str(i) for i in range(len(desired))]
    for label, value, actual in zip(labels, desired, live, strict=True):
        yield from differences(value, actual, f"{path}[{label}]")


def declared(stack: StackConfig) -> dict[str, list[Object]]:
    """What the stack declares around its plugins, by the scope a check names (a node, or `cluster`)."""
    plugin = stack.device_plugin
    found: dict[str, list[Object]] = {
        "cluster": [{"kind": "NetworkPolicy", **policy} for policy in network_policies(plugin.namespace).values()]
        + [{"kind": "RuntimeClass", **runtime_class} for runtime_class in runtime_classes(stack.nodes)]
    }
    for node in stack.nodes:
        found[node.name] = _of_node(stack, node)
    return found


def _nothing_beside(stack: StackConfig, live: dict[Key, Object], mine: set[Key]) -> Iterator[Check]:
    """No NetworkPolicy in the plugin namespace but the stack's (`mine`; policies add up: another one may open what
    the stack's close), and no ClusterRoleBinding gives a pinned DRA plugin's account more than the stack's binding."""
    namespace = stack.device_plugin.namespace
    others = sorted(k[2] for k in live if k[0] == "NetworkPolicy" and k[1] == namespace and k not in mine)
    yield Check("cluster", f"other NetworkPolicies in {namespace}", "none", ",".join(others) or "none")
    for node in stack.nodes:
        if node.allocator != Allocator.DRA or not node.exposed_gpus:
            continue
        account = {"kind": "ServiceAccount", "namespace": namespace, "name": dra_plugin_name(node.name)}
        binds = sorted(
            name
            for (kind, _, name), obj in live.items()
            if kind == "ClusterRoleBinding"
            and (kind, "", name) not in mine
            and any({k: s.get(k) for k in account} == account for s in obj.get("subjects") or [])
        )
        what = f"other ClusterRoleBindings of ServiceAccount {namespace}/{account['name']}"
        yield Check(node.name, what, "none", ",".join(binds) or "none")


def _of_node(stack: StackConfig, node: NodeConfig) -> list[Object]:
    if not node.exposed_gpus:
        return []
    plugin = stack.device_plugin
    objects = plugin_objects(node, plugin)
    if node.allocator == Allocator.DRA:
        objects += dra_plugin_objects(node, plugin, (stack.dra_settings or DraConfig()).kubelet_plugin_image)
    return objects + [obj for operand in pinned_operands(node) for obj in operand_objects(operand, node, plugin)]


def check_declared(stack: StackConfig, live: dict[Key, Object]) -> Iterator[Check]:
    """One check per declared object: `as declared`, or the fields that differ; then what stands beside them."""
    every = declared(stack)
    for scope, objects in every.items():
        for obj in objects:
            kind, namespace, name = key_of(obj)
            found = live.get((kind, namespace, name))
            what = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
            if found is None:
                yield Check(scope, what, "as declared", "<missing>")
                continue
            body = _without_provider_annotations({k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})
            found_differences = [*_template_annotations(body, found), *differences(body, found)]
            yield Check(scope, what, "as declared", "; ".join(found_differences) or "as declared")

    yield from _nothing_beside(stack, live, {key_of(obj) for objects in every.values() for obj in objects})


def _without_provider_annotations(body: Object) -> Object:
    """How the provider applies an object (pulumi.com/...) is not what the object holds: it may keep them or not."""
    annotations = body["metadata"].get("annotations") or {}
    kept = {k: v for k, v in annotations.items() if not k.startswith(PROVIDER_ANNOTATION_PREFIX)}
    body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "annotations"}}
    if kept:
        body["metadata"]["annotations"] = kept
    return body


def _template_annotations(body: Object, found: Object) -> Iterator[str]:
    """A pod template's annotations whole (one naming a CDI device would hand the pods a GPU): taken out of `body`,
    compared here with the live ones but the roll's."""
    template = (body.get("spec") or {}).get("template")
    if template is None:
        return
    wanted = template["metadata"].pop("annotations", None) or {}
    live_template = ((found.get("spec") or {}).get("template") or {}).get("metadata") or {}
    live = {k: v for k, v in (live_template.get("annotations") or {}).items() if k != ROLL_ANNOTATION}
    for key in sorted(set(live) | set(wanted)):
        if live.get(key) != wanted.get(key):
            yield f"spec.template.metadata.annotations.{key} {_shown(live.get(key))}"
