"""What a hidden node is labelled with, the RuntimeClass its pods name and, where DRA allocates it, the DeviceClass
they claim from: plain data, no Pulumi (cluster.verify checks the live cluster against it)."""

from __future__ import annotations

import json

from common.names import (
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN_LABEL,
    DRA_UUID_ATTRIBUTE,
    GPU_QUOTA_KEY,
    NODE_LABEL,
    OPERAND_LABELS,
    PINNED_OPERANDS,
    POOL_LABEL,
    Allocator,
    MigStrategy,
    OperandMode,
    dra_quota_key,
)
from stack_config.models import StackConfig
from stack_config.node_config import NodeConfig, OperandsConfig


def gpu_device_classes(stack: StackConfig) -> dict[str, list[str]]:
    """The stack's DeviceClasses and the UUIDs each selects (StackConfig.dra_classes)."""
    return stack.dra_classes


def device_selector(driver: str, uuids: list[str]) -> str:
    """CEL: one of this driver's devices whose UUID attribute is listed. An unknown attribute domain reads as an
    empty map, but an absent attribute is an error that aborts the allocation (resource.k8s.io/v1
    CELDeviceSelector), so the attribute's presence is tested first: a device without one is not selected."""
    attributes = f"device.attributes[{json.dumps(driver)}]"
    return (
        f"device.driver == {json.dumps(driver)} && {json.dumps(DRA_UUID_ATTRIBUTE)} in {attributes}"
        f" && {attributes}.{DRA_UUID_ATTRIBUTE} in {json.dumps(uuids)}"
    )


def quota_hard(limit: int, device_classes: list[str]) -> dict[str, str]:
    """A namespace quota's hard limits: nvidia.com/gpu requests, and the devices claims of each GPU class allocate
    (cluster.verify compares the live quota with them)."""
    return {GPU_QUOTA_KEY: str(limit)} | {dra_quota_key(name): str(limit) for name in sorted(device_classes)}


def node_labels(node: NodeConfig) -> dict[str, str]:
    """Everything the node patch sets: the operator's switches, and the labels the RuntimeClasses
    schedule by (the node's own name, its pool)."""
    return operator_labels(node) | {NODE_LABEL: node.name} | ({POOL_LABEL: node.pool} if node.pool else {})


def operands_off(node: NodeConfig) -> str:
    """The operands (the part of `nvidia.com/gpu.deploy.<operand>` after the prefix) hidden-gpu holds off, in a
    fixed order, comma-separated."""
    return ",".join(label.removeprefix(DEPLOY_LABEL_PREFIX) for label in operator_labels(node))


def operand_setting(
    operands: OperandsConfig,
    field: str,
    *,
    exposes: bool,
    mig: MigStrategy = MigStrategy.NONE,
    allocator: Allocator = Allocator.DEVICE_PLUGIN,
) -> bool | OperandMode:
    """An operand's setting with its default filled in: on (the operator's), off, or pinned (hidden-gpu's)."""
    wanted: bool | OperandMode | None = getattr(operands, field)
    if wanted is not None:
        return wanted
    if field == "dcgm_exporter":
        # Metrics of the exposed GPUs stay, of them alone; with MIG the pinned one is not offered (models.py).
        return OperandMode.PINNED if exposes and mig == MigStrategy.NONE else OperandMode.OFF
    if field == "operator_validator":
        # Its plugin check waits for an NVIDIA resource: a node with none (every GPU hidden, or handed out by DRA)
        # never passes it (gpu-operator cmd/nvidia-validator/main.go, validateGPUResource).
        return exposes and allocator == Allocator.DEVICE_PLUGIN
    return exposes


def planned_operands(operands: OperandsConfig, *, exposes: bool, mig: MigStrategy) -> list[str]:
    """The operands hidden-gpu runs on a node itself, pinned to its exposed GPUs (PINNED_OPERANDS values)."""
    return [
        name
        for field, name in PINNED_OPERANDS.items()
        if operand_setting(operands, field, exposes=exposes, mig=mig) == OperandMode.PINNED
    ]


def pinned_operands(node: NodeConfig) -> list[str]:
    return planned_operands(node.operands, exposes=bool(node.exposed_gpus), mig=node.mig_strategy)


def operator_labels(node: NodeConfig) -> dict[str, str]:
    """The GPU Operator's per-node switches: its device plugin always off, other operands as configured (a pinned
    one is the operator's off)."""
    labels = {DEVICE_PLUGIN_LABEL: "false"}
    for field, label in OPERAND_LABELS.items():
        setting = operand_setting(
            node.operands, field, exposes=bool(node.exposed_gpus), mig=node.mig_strategy, allocator=node.allocator
        )
        if setting is not True:
            labels[label] = "false"
    return labels
