"""The cluster as cluster.verify reads it (one LIST per kind), and what one check of it says."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cluster.kube import ForbiddenError, Reader
from common.names import (
    DRA_API_PATH,
    OPERATOR_OPERAND_APPS,
    OPERATOR_PLUGIN_APP,
    PART_OF,
    PART_OF_LABEL,
    STACK_LABEL,
)
from desired.stack_claims import Claim

OURS = f"{PART_OF_LABEL}={PART_OF}"
OPERATOR_APPS = (OPERATOR_PLUGIN_APP, *OPERATOR_OPERAND_APPS.values())
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
# What cluster/leftovers.py judges, by collection.
LEFTOVER_PATHS = {
    "namespaces": "/api/v1/namespaces",
    "configmaps": "/api/v1/configmaps",
    "secrets": "/api/v1/secrets",
    "resourceclaims": f"{DRA_API_PATH}/resourceclaims",
    "templates": f"{DRA_API_PATH}/resourceclaimtemplates",
    "pods": "/api/v1/pods",
}


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
    # hidden-gpu's pods in the plugin's namespace (and an adopted plugin's): pinned plugins, GFD and dcgm-exporter.
    pinned: list[dict[str, Any]]
    # The GPU Operator's plugin, GFD and dcgm-exporter pods, everywhere (each reads every GPU of its node).
    operator_pods: list[dict[str, Any]]
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
    # The pods of the hand-made DaemonSets shared by several nodes (adoptDevicePlugin.shared), by its selector.
    shared_pods: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    # hidden-gpu's DaemonSets, ConfigMaps, ServiceAccounts and ClusterRoles, every ClusterRoleBinding, the plugin
    # namespace's NetworkPolicies, by (kind, namespace, name): cluster/declared.py compares them with the stack's.
    declared: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    # What cluster/leftovers.py judges, by collection: namespaces, configmaps, secrets, resourceclaims, templates,
    # pods (every one in the cluster).
    leftovers: dict[str, list[dict[str, Any]] | None] = field(default_factory=dict)

    def compared(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Every object cluster/declared.py compares, by (kind, namespace, name)."""
        return {**self.declared, **{("RuntimeClass", "", name): obj for name, obj in self.runtime_classes.items()}}

    @classmethod
    def read(
        cls,
        reader: Reader,
        plugin_namespace: str,
        *,
        mutating: bool = False,
        adopted: Iterable[tuple[str, str]] = (),
        shared: Iterable[tuple[str, str]] = (),
    ) -> Live:
        def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
            return {i["metadata"].get("name", ""): i for i in items}

        taken_over = sorted(set(adopted))
        found = {
            (namespace, name): reader.find(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
            for namespace, name in taken_over
        }
        # An adopted plugin's pods stay in its own namespace, labelled as ours are.
        namespaces = sorted({plugin_namespace, *(namespace for namespace, _ in taken_over)})
        return cls(
            nodes=by_name(reader.list("/api/v1/nodes")),
            pinned=[
                pod for namespace in namespaces for pod in reader.list(f"/api/v1/namespaces/{namespace}/pods", OURS)
            ],
            operator_pods=reader.list("/api/v1/pods", f"app in ({','.join(OPERATOR_APPS)})"),
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
            adopted=found,
            shared_pods={
                key: reader.list(f"/api/v1/namespaces/{key[0]}/pods", _selector(daemon_set))
                for key in sorted(set(shared))
                if (daemon_set := found.get(key)) is not None
            },
            declared=_declared(reader, plugin_namespace),
            leftovers={kind: _readable(reader, kind, path) for kind, path in LEFTOVER_PATHS.items()},
        )


# The kinds hidden-gpu declares around its plugins (cluster/declared.py), by collection: a LIST's items carry no kind.
# Its own, by label; every ClusterRoleBinding, and every NetworkPolicy of the plugin namespace: another one that
# binds a pinned plugin's account or opens its pods' network widens what the stack declares.
DECLARED_PATHS = {
    "DaemonSet": "/apis/apps/v1/daemonsets",
    "ConfigMap": "/api/v1/configmaps",
    "ServiceAccount": "/api/v1/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
}
ALL_BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


def _declared(reader: Reader, plugin_namespace: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Those objects, by (kind, namespace, name)."""
    found = [(kind, o) for kind, path in DECLARED_PATHS.items() for o in reader.list(path, OURS)]
    found += [("ClusterRoleBinding", o) for o in reader.list(ALL_BINDINGS)]
    policies = f"/apis/networking.k8s.io/v1/namespaces/{plugin_namespace}/networkpolicies"
    found += [("NetworkPolicy", o) for o in reader.list(policies)]
    return {(kind, o["metadata"].get("namespace", ""), o["metadata"].get("name", "")): o for kind, o in found}


# Helm's release records (up to about 1 MiB each, holding no env) are left out of the Secrets read.
FIELD_SELECTORS = {"secrets": "type!=helm.sh/release.v1"}


def _readable(reader: Reader, kind: str, path: str) -> list[dict[str, Any]] | None:
    """The collection, or None where this identity may not list it (cluster/leftovers.py says so as a mismatch)."""
    try:
        return reader.list(path, field_selector=FIELD_SELECTORS.get(kind))
    except ForbiddenError:
        return None


def _selector(daemon_set: dict[str, Any]) -> str:
    """A DaemonSet's matchLabels as a label selector (a hand-made plugin's has no matchExpressions to speak of)."""
    labels = ((daemon_set.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
