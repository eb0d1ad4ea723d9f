"""What verify checks of a hand-made plugin DaemonSet a node names (`nodes[].adoptDevicePlugin`): one taken over has
converged to hidden-gpu's fields; one shared by several nodes has left this node (docs/operations.md, "Adopting a
hand-made setup")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cluster.live import Check, Live
from common.names import FIELD_MANAGER, NODE_LABEL
from stack_config import NodeConfig

# The required node-affinity expression a shared hand-made DaemonSet carries in every term.
LEAVES = f"{NODE_LABEL} DoesNotExist in every term"


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


def terms_staying(daemon_set: dict[str, Any]) -> list[int]:
    """The indices of the DaemonSet's required node-selector terms that do not require the node label absent: the
    terms are ORed, so one such term keeps its pods on hidden-gpu's nodes ([-1]: no required node affinity at all)."""
    pod = ((daemon_set.get("spec") or {}).get("template") or {}).get("spec") or {}
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        return [-1]
    return [
        index
        for index, term in enumerate(terms)
        if not any(
            e.get("key") == NODE_LABEL and e.get("operator") == "DoesNotExist"
            for e in term.get("matchExpressions") or []
        )
    ]


def _pods_of(live: Live, namespace: str, name: str, node: str) -> list[str]:
    pods = live.shared_pods.get((namespace, name)) or []
    return sorted(
        p["metadata"].get("name", "")
        for p in pods
        if (p.get("spec") or {}).get("nodeName") == node
        and any(
            r.get("kind") == "DaemonSet" and r.get("name") == name for r in p["metadata"].get("ownerReferences") or []
        )
    )


def check_adoption(node: NodeConfig, live: Live) -> Iterator[Check]:
    adopt = node.adopt_device_plugin
    if adopt is None or not node.exposed_gpus:
        return
    found = live.adopted.get((adopt.namespace, adopt.name))
    named = f"{adopt.namespace}/{adopt.name}"
    if not adopt.shared:
        left = "<missing>" if found is None else ", ".join(leftover_fields(found)) or "none"
        yield Check(node.name, f"adopted {named}: fields only its maker set", "none", left)
        return
    # A shared one may be gone once no node needs it; while it exists it must leave every node hidden-gpu labels.
    if found is not None:
        staying = terms_staying(found)
        fix = f"add {{key: {NODE_LABEL}, operator: DoesNotExist}} to every nodeSelectorTerms entry"
        where = "no required node affinity" if staying == [-1] else f"not in terms {staying}"
        yield Check(
            node.name, f"shared {named} leaves hidden-gpu's nodes", LEAVES, f"{where}: {fix}" if staying else LEAVES
        )
    pods = _pods_of(live, adopt.namespace, adopt.name, node.name)
    yield Check(node.name, f"shared {named} pods on the node", "0", f"{len(pods)} ({', '.join(pods)})" if pods else "0")
