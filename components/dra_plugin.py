"""NVIDIA's DRA kubelet plugin pinned to a DRA node's exposed GPUs, and its identity, as resources: what they hold is
desired/dra_plugin.py."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import pulumi
import pulumi_kubernetes as k8s

from common.names import DRA_PLUGIN_NAME
from components.inputs import as_args, derive
from desired.dra_plugin import (
    cluster_role_rules,
    daemon_set_metadata,
    dra_plugin_spec,
    identity_metadata,
    role_ref,
    subject,
)
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig


class DraPluginObjects:
    """The node's plugin DaemonSet and its identity: a ServiceAccount, a ClusterRole and its binding."""

    def __init__(
        self,
        prefix: str,
        node_name: str | pulumi.Output[str],
        node: NodeConfig | pulumi.Output[NodeConfig],
        plugin: DevicePluginConfig,
        image: str,
        *,
        namespace: pulumi.Input[str],
        runtime_class: pulumi.Input[str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        named = f"{prefix}-{DRA_PLUGIN_NAME}"
        self.service_account = k8s.core.v1.ServiceAccount(
            named, metadata=as_args(derive(node_name, lambda n: identity_metadata(n, namespace))), opts=opts
        )
        self.cluster_role = k8s.rbac.v1.ClusterRole(
            named,
            metadata=as_args(derive(node_name, identity_metadata)),
            rules=as_args(cluster_role_rules()),
            opts=opts,
        )
        account = self.service_account.metadata
        self.binding = k8s.rbac.v1.ClusterRoleBinding(
            named,
            metadata=as_args(derive(node_name, identity_metadata)),
            # By the objects' outputs: the binding waits for both.
            role_ref=as_args(role_ref(self.cluster_role.metadata.name)),
            subjects=[as_args(subject(account.name, account.namespace))],
            opts=opts,
        )
        self.daemon_set = k8s.apps.v1.DaemonSet(
            named,
            metadata=as_args(derive(node_name, lambda n: daemon_set_metadata(n, image, namespace))),
            spec=as_args(derive(node, lambda n: dra_plugin_spec(n, plugin, image, runtime_class))),
            # Its identity first: a pod without its binding would publish nothing and crash.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[self.binding])),
        )
