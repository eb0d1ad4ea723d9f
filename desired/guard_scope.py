"""Which pods the access guard's pod rules judge (guard.scope), as CEL: plain data, no Pulumi.

`sharedNodes` judges a pod that can reach a node of the stack: one tolerating the shared-node taint the platform
puts on those nodes (any toleration of its key, or of every key, whatever its value and effect: judged rather than
guessed at), one naming a node (`spec.nodeName` skips the scheduler and its taints), and one under an NVIDIA
runtime (it may be handed a GPU wherever it runs). Every other pod can be scheduled to no shared node and is
admitted untouched.

A pod can enter the scope after its create: an UPDATE may add tolerations (k8s.io/kubernetes v1.37.2
pkg/apis/core/validation/validation.go, ValidatePodUpdate: tolerations may be added), and a scheduling gate keeps a
pod unbound meanwhile. Such an UPDATE is judged as the pod's create.
"""

from __future__ import annotations

import json

from common.names import SHARED_NODE_TAINT, GuardScope

SCOPE_CONDITION = "shared-node-scope"


def tolerates_shared_taint(obj: str) -> str:
    """CEL: some toleration of the pod names the shared-node taint's key, or every key (`operator: Exists` with no
    key)."""
    return (
        f"has({obj}.spec.tolerations) && {obj}.spec.tolerations.exists(t,"
        f" (has(t.key) && t.key == {json.dumps(SHARED_NODE_TAINT)})"
        " || ((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists'))"
    )


def in_scope(obj: str, nvidia_runtime: str) -> str:
    """CEL: the pod can reach a shared node. `nvidia_runtime`: the guard's test for an NVIDIA runtime, on `obj`."""
    return (
        f"(has({obj}.spec.nodeName) && {obj}.spec.nodeName != '') || ({tolerates_shared_taint(obj)})"
        f" || ({nvidia_runtime})"
    )


def scope_conditions(scope: GuardScope, nvidia_runtime: str) -> list[tuple[str, str]]:
    """The pod policy's match conditions beyond the exemption: none for the whole cluster."""
    return [] if scope == GuardScope.CLUSTER else [(SCOPE_CONDITION, in_scope("object", nvidia_runtime))]


def entering_scope(scope: GuardScope, old_nvidia_runtime: str) -> str | None:
    """CEL: an UPDATE of a pod the scope did not judge before (its old object out of scope); None for the whole
    cluster, where every pod was judged at its create."""
    if scope == GuardScope.CLUSTER:
        return None
    return f"request.operation == 'UPDATE' && oldObject != null && !({in_scope('oldObject', old_nvidia_runtime)})"
