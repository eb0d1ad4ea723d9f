"""The access guard's settings (`hidden-gpu:guard`): mode, exemptions, runtime classes, device classes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from common.names import (
    BASELINE_CAPABILITIES,
    DEFAULT_EXEMPT_NAMESPACES,
    NVIDIA_CLASS_DOMAIN,
    OPERATOR_RUNTIME_CLASSES,
    RUNTIME_CLASS_PREFIX,
    GuardMode,
    GuardScope,
)
from stack_config.values import (
    Capability,
    LabelKey,
    LabelValue,
    LaxEnum,
    NamespaceName,
    ObjectName,
    StrictModel,
    TenantHostPath,
    raise_problems,
)


class GuardConfig(StrictModel):
    """The admission policy that keeps pods away from hidden GPUs."""

    mode: Annotated[GuardMode, LaxEnum] = GuardMode.ENFORCE
    """`enforce` denies; `warn` admits, warns the client and annotates the audit log; `audit` only annotates."""
    exempt_namespaces: list[NamespaceName] = Field(default_factory=lambda: list(DEFAULT_EXEMPT_NAMESPACES))
    """Namespaces the guard does not check (trusted: they may reach any GPU); the plugin's namespace is always added."""
    exempt_namespace_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Label `key: value` pairs: a namespace carrying any of them is exempt too, so the platform's CNI, CSI and
    monitoring namespaces can be trusted by a label instead of a stack edit each. Only who may label namespaces
    may then exempt one."""
    allowed_host_paths: list[TenantHostPath] = Field(default_factory=list)
    """Host paths tenant pods may mount, exactly and read-only only; any other hostPath is denied. Never `/`, `/dev`,
    `/proc`, `/sys`, `/run`, `/var/run`, the kubelet's or containerd's state, CDI specs or the toolkit's config, nor a
    path above or below one."""
    allowed_capabilities: list[Capability] = Field(default_factory=lambda: list(BASELINE_CAPABILITIES))
    """Capabilities tenant containers may add (compared as containerd does: any letter case, `CAP_` optional).
    Default: what Pod Security `baseline` allows. `SYS_ADMIN` and `ALL` are never allowed."""
    plain_runtime_classes: list[ObjectName] = Field(default_factory=list)
    """RuntimeClasses whose handler does not run the NVIDIA toolkit (e.g. `gvisor`, `kata`). A pod naming any other
    RuntimeClass is judged as running under NVIDIA's runtime: its every container must request an NVIDIA resource or
    set `NVIDIA_VISIBLE_DEVICES=void`. `cluster.verify` fails if a class listed here has an NVIDIA handler."""
    nvidia_is_default_runtime: bool = False
    """`true` if `nvidia` is containerd's default runtime on the GPU nodes: then every tenant container runs the
    toolkit, and each must request an NVIDIA resource or set `NVIDIA_VISIBLE_DEVICES=void`."""
    scope: Annotated[GuardScope, LaxEnum] = GuardScope.CLUSTER
    """Which pods the pod rules judge: `cluster`, every pod outside the exempt namespaces; `sharedNodes`, only pods
    that can reach a node of this stack: those tolerating the taint `hidden-gpu.io/shared-node` (which the platform
    puts on each such node: `kubectl taint node <node> hidden-gpu.io/shared-node=true:NoSchedule`), naming a node
    (`spec.nodeName`, which bypasses the scheduler's taints), or running under an NVIDIA runtime. Other pods are
    admitted untouched and can be scheduled to no shared node; `cluster.verify` fails on a stack node without the
    taint. The ConfigMap/Secret and claim policies judge the whole cluster either way."""
    allowed_device_classes: list[ObjectName] = Field(default_factory=list)
    """DeviceClass names (say a NIC class) tenants may use through Dynamic Resource Allocation: their ResourceClaims
    and ResourceClaimTemplates may name them, and their containers may request the class's extended resource
    `deviceclass.resource.kubernetes.io/<class>`. Every other class is denied outside exempt namespaces (the stack's
    own GPU classes, from `hidden-gpu:dra`, are added): a class selects whatever devices its selector matches, hidden
    GPUs included: `make render` warns of each where the stack hides GPUs, and `cluster.verify` fails if one selects a
    hidden GPU in a node's ResourceSlices. NVIDIA's own classes (`*.nvidia.com`) select every GPU the driver publishes
    and are refused."""
    add_void: bool = False
    """Add `NVIDIA_VISIBLE_DEVICES=void` to each new container under an NVIDIA runtime that neither requests an NVIDIA
    resource nor sets the variable (a sidecar, an init or `kubectl debug` container), instead of denying it; never to
    one that requests a GPU. A MutatingAdmissionPolicy: needs Kubernetes 1.36+ (`admissionregistration.k8s.io/v1`)."""

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            raise_problems(((key,), data[key], reason) for key, reason in _RETIRED_GUARD_KEYS.items() if key in data)
        return data

    def exempt_with(self, plugin_namespace: str) -> list[str]:
        """The namespaces exempt from the guard: these, and the plugin's own always (its pods mount host paths)."""
        return sorted({*self.exempt_namespaces, plugin_namespace})

    @model_validator(mode="after")
    def _rules_across_fields(self) -> GuardConfig:
        raise_problems(
            (("plainRuntimeClasses", index), name, "an NVIDIA RuntimeClass (this stack's or the GPU Operator's)")
            for index, name in enumerate(self.plain_runtime_classes)
            if name in OPERATOR_RUNTIME_CLASSES or name.startswith(RUNTIME_CLASS_PREFIX)
        )
        raise_problems(
            (("allowedDeviceClasses", index), name, reason)
            for index, name in enumerate(self.allowed_device_classes)
            if (reason := _device_class_problem(name))
        )
        if self.scope == GuardScope.SHARED_NODES and self.nvidia_is_default_runtime:
            raise_problems(
                [
                    (
                        ("scope",),
                        str(self.scope),
                        "with nvidiaIsDefaultRuntime every pod runs under NVIDIA's runtime and is judged wherever it "
                        "runs: the scope would judge every pod anyway; set scope: cluster",
                    )
                ]
            )
        return self


_RETIRED_GUARD_KEYS = {
    "nvidiaRuntimeClasses": "retired: a list of NVIDIA classes is never complete, so every RuntimeClass is now judged "
    "as NVIDIA's unless listed in guard.plainRuntimeClasses; delete this key",
    "allowResourceClaims": "retired: tenants' ResourceClaims and ResourceClaimTemplates are now judged themselves, by "
    "the DeviceClasses they name: list the classes tenants may use in guard.allowedDeviceClasses (the stack's own GPU "
    "classes come from hidden-gpu:dra) and delete this key",
}


def _device_class_problem(name: str) -> str | None:
    """Why a tenant may not be allowed this DeviceClass, if so."""
    if name == NVIDIA_CLASS_DOMAIN or name.endswith(f".{NVIDIA_CLASS_DOMAIN}"):
        return (
            "an NVIDIA DeviceClass: it selects every device NVIDIA's DRA driver publishes, hidden GPUs included; "
            "set hidden-gpu:dra for classes of the exposed GPUs only"
        )
    if name.startswith(RUNTIME_CLASS_PREFIX):
        return "the stack's own DeviceClasses come from hidden-gpu:dra; list only other classes here"
    return None
