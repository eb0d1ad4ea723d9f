"""Pulumi type tokens: of the components hidden-gpu registers (`hidden-gpu:index:<Name>`) and of the Kubernetes
resources they create, for the program, the tests, the policy pack and the render."""

from __future__ import annotations

from common.names import PROJECT


def component_token(name: str) -> str:
    return f"{PROJECT}:index:{name}"


class Token:
    """Type tokens of what the program registers, for the tests, the policy pack and the render."""

    HIDDEN_GPU_NODE = component_token("HiddenGpuNode")
    GPU_QUOTAS = component_token("GpuQuotas")
    PLUGIN_NAMESPACE = component_token("PluginNamespace")
    ACCESS_GUARD = component_token("AccessGuard")
    GPU_POOL = component_token("GpuPool")
    TOOLKIT_SETTINGS = component_token("ToolkitSettings")
    STACK_RECORD = component_token("StackRecord")
    GPU_DEVICE_CLASSES = component_token("GpuDeviceClasses")
    PROVIDER = "pulumi:providers:kubernetes"
    NODE_PATCH = "kubernetes:core/v1:NodePatch"
    NAMESPACE = "kubernetes:core/v1:Namespace"
    CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
    RESOURCE_QUOTA = "kubernetes:core/v1:ResourceQuota"
    DAEMONSET = "kubernetes:apps/v1:DaemonSet"
    RUNTIME_CLASS = "kubernetes:node.k8s.io/v1:RuntimeClass"
    NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
    ADMISSION_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
    ADMISSION_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
    MUTATING_POLICY = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicy"
    MUTATING_BINDING = "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicyBinding"
    CLUSTER_POLICY_PATCH = "kubernetes:nvidia.com/v1:ClusterPolicyPatch"
    DEVICE_CLASS = "kubernetes:resource.k8s.io/v1:DeviceClass"
    SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
    CLUSTER_ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
    CLUSTER_ROLE_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
