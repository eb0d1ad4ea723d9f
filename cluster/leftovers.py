"""What the guard's rollout leaves behind (issue 40, 1): objects made while the guard only warned, before it
existed, or while a namespace was exempt, that no admission request judges again. cluster.verify names each, so
the rollout can make a clean verify the step before `enforce` (docs/operations.md, "Rollout").

- ConfigMaps and Secrets carrying a device key (NVIDIA_VISIBLE_DEVICES, the toolkit's feature variables): a
  container's `envFrom` without a prefix turns them into env, and a pod policy cannot read the object.
- ResourceClaims and ResourceClaimTemplates the claim rules would deny (a class tenants may not use, adminAccess,
  device tolerations, all of a GPU class): one already allocated keeps its devices, whatever the guard says now.
- Pods the enforcing pod rules would deny, judged as their CREATE, in the same CEL as the API server's (the
  program's own rules, evaluated here by common-expression-language). Without `spec.nodeName`: once bound, a pod the
  scheduler placed cannot be told from one created on a node, so that one rule is not judged here.

Each in the namespaces the guard judges: not exempt by name, nor by label."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from cluster.dra import compiled
from cluster.live import Check
from common.names import DEVICE_ENV, NVIDIA_RESOURCE_PATTERN, Allocator
from desired.guard_rules import policy_specs
from desired.guard_settings import GuardSettings, PolicySpec
from desired.pod_checks import POSITIVE_QUANTITY
from stack_config import StackConfig

CLEAN = "none"


def _judged(args: GuardSettings, namespaces: dict[str, dict[str, Any]], namespace: str) -> bool:
    labels = ((namespaces.get(namespace) or {}).get("metadata") or {}).get("labels") or {}
    exempt_by_label = any(labels.get(key) == value for key, value in args.exempt_namespace_labels.items())
    return namespace not in args.exempt_namespaces and not exempt_by_label


def _where(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def denied_rules(
    spec: PolicySpec, obj: dict[str, Any], namespace: dict[str, Any] | None, stack_nodes: frozenset[str] = frozenset()
) -> list[str]:
    """The rules an enforcing guard denies this pod, claim or template by, judged as its CREATE (a pod without
    `spec.nodeName`); none where the policy's scope does not reach it: a pod bound to a node counts as naming one
    only where that node is the stack's (`stack_nodes`), as that is what the scope keeps judged."""
    created, bound = copy.deepcopy(obj), None
    if obj.get("kind", "Pod") == "Pod":
        bound = (created.get("spec") or {}).pop("nodeName", None)
    kind = {"kind": obj.get("kind", "Pod")}
    request = {"operation": "CREATE", "namespace": _where(obj)[0], "subResource": "", "kind": kind}
    context: dict[str, Any] = {"object": created, "oldObject": None, "request": request, "namespaceObject": namespace}
    if spec.conditions:
        placed = copy.deepcopy(created)
        if bound in stack_nodes:
            placed["spec"]["nodeName"] = bound
        if not all(compiled(expression).execute({**context, "object": placed}) for _, expression in spec.conditions):
            return []
    context["variables"] = {}
    for name, expression in spec.variables:
        context["variables"][name] = compiled(expression).execute(context)
    return [rule.name for rule in spec.rules if not compiled(rule.expression).execute(context)]


def check_leftovers(stack: StackConfig, listed: dict[str, list[dict[str, Any]] | None]) -> Iterator[Check]:
    """`listed`: the live namespaces, configmaps, secrets, resourceclaims, resourceclaimtemplates and pods; None for
    a collection this identity may not list, a mismatch: what cannot be read cannot be called clean."""
    unreadable = sorted(kind for kind, items in listed.items() if items is None)
    for kind in unreadable:
        yield Check("cluster", f"list {kind} (what the rollout left)", "readable", "forbidden: grant get/list")
    objects = {kind: items or [] for kind, items in listed.items()}
    args = GuardSettings.of(stack)
    namespaces = {_where(n)[1]: n for n in objects["namespaces"]}
    found: list[Check] = []
    for kind, items in (("ConfigMap", objects["configmaps"]), ("Secret", objects["secrets"])):
        for obj in items:
            namespace, name = _where(obj)
            keys = sorted(set(obj.get("data") or {}) & set(DEVICE_ENV))
            if keys and _judged(args, namespaces, namespace):
                found.append(Check(namespace, f"{kind} {name}: device keys envFrom would pass", CLEAN, ",".join(keys)))
    pods_spec, _, claims_spec = policy_specs(args)
    # Every claim rule (the classes, adminAccess, tolerations, an exact count), as at the claim's creation.
    for kind, items in (("ResourceClaim", objects["resourceclaims"]), ("ResourceClaimTemplate", objects["templates"])):
        for obj in items:
            namespace, name = _where(obj)
            if not _judged(args, namespaces, namespace):
                continue
            if rules := denied_rules(claims_spec, {**obj, "kind": kind}, namespaces.get(namespace)):
                found.append(Check(namespace, f"{kind} {name}: the claim rules would deny it", CLEAN, ",".join(rules)))
    for pod in objects["pods"]:
        namespace, name = _where(pod)
        if not _judged(args, namespaces, namespace) or (pod.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        if rules := denied_rules(pods_spec, pod, namespaces.get(namespace), frozenset(n.name for n in stack.nodes)):
            found.append(Check(namespace, f"Pod {name}: the enforcing guard would deny it", CLEAN, ",".join(rules)))
    yield from found or [Check("cluster", "objects the rollout left that the guard would deny", CLEAN, CLEAN)]
    yield from _held_by_the_old_allocator(stack, objects["pods"])


def _held_by_the_old_allocator(stack: StackConfig, pods: list[dict[str, Any]]) -> Iterator[Check]:
    """A node switched to `allocator: dra` loses its plugin, not the GPUs its pods were given: the kubelet keeps
    them, while the DRA allocator takes them for free and hands them out again. Such pods must go first."""
    for node in stack.nodes:
        if node.allocator != Allocator.DRA:
            continue
        held = sorted(
            "/".join(_where(pod))
            for pod in pods
            if (pod.get("spec") or {}).get("nodeName") == node.name
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and _requests_nvidia(pod)
        )
        yield Check(
            node.name, "pods holding a device plugin's GPU (allocator dra: drain them)", CLEAN, ",".join(held) or CLEAN
        )


def _requests_nvidia(pod: dict[str, Any]) -> bool:
    """Some container asks for a positive amount of an NVIDIA resource, as the guard reads it (pod_checks: limits,
    where the API server requires an extended resource to be, and POSITIVE_QUANTITY)."""
    spec = pod.get("spec") or {}
    return any(
        re.match(NVIDIA_RESOURCE_PATTERN, name) and re.match(POSITIVE_QUANTITY, str(amount))
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        for name, amount in ((container.get("resources") or {}).get("limits") or {}).items()
    )
