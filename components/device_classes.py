"""GpuDeviceClasses: for clusters that allocate GPUs through Dynamic Resource Allocation, a DeviceClass per pool (or
per node outside a pool) that selects only the GPUs the stack exposes there."""

# No `from __future__ import annotations`: Pulumi's analyzer (package/) reads the annotations as types.
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from common.names import PART_OF, PART_OF_LABEL
from common.tokens import Token
from components.inputs import derive, validated_input
from desired.node_labels import device_selector
from stack_config.errors import InvalidInputError, validated
from stack_config.values import DeviceUuid, ObjectName


class GpuDeviceClassesArgs(TypedDict):
    """A TypedDict: what Pulumi's component provider hands the component (package/)."""

    driver: str
    """The DRA driver that publishes the GPUs (NVIDIA's: `gpu.nvidia.com`)."""
    classes: Mapping[str, pulumi.Input[Sequence[pulumi.Input[str]]]]
    """DeviceClass name -> the exposed UUIDs it selects. The UUIDs may be Outputs, validated once known (where a
    preview does not know them, neither does it the selector); the names are plain: each names a resource."""


class GpuDeviceClasses(pulumi.ComponentResource):
    """Only the exposed UUIDs appear in them, never a hidden one: a claim from a class can get nothing else, and the
    access guard lets tenants claim from no class that might (guard.allowedDeviceClasses)."""

    device_classes: dict[str, k8s.resource.v1.DeviceClass]
    """The DeviceClass of each name."""

    def __init__(self, name: str, args: GpuDeviceClassesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(Token.GPU_DEVICE_CLASSES, name, None, opts)
        # Checked here too: a consumer's values are written into CEL.
        driver = validated(ObjectName, args["driver"], ("driver",))
        classes: dict[str, Any] = validated(dict[ObjectName, Any], args["classes"], ("classes",))
        component = f"GpuDeviceClasses {name}"
        # Every class judged before any is declared: each plain class's problems reported at once, and no class
        # registered where another is refused.
        selected: dict[str, Any] = {}
        problems: list[str] = []
        for class_name, uuids in sorted(classes.items()):
            try:
                selected[class_name] = validated_input(list[DeviceUuid], uuids, ("classes", class_name), component)
            except InvalidInputError as error:
                problems.append(str(error))
        if problems:
            raise InvalidInputError("\n".join(problems))
        self.device_classes = {
            class_name: k8s.resource.v1.DeviceClass(
                f"{name}-{class_name}",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=class_name, labels={PART_OF_LABEL: PART_OF}),
                spec=k8s.resource.v1.DeviceClassSpecArgs(
                    selectors=[
                        k8s.resource.v1.DeviceSelectorArgs(
                            cel=k8s.resource.v1.CELDeviceSelectorArgs(
                                expression=derive(known, lambda uuids: device_selector(driver, uuids))
                            )
                        )
                    ]
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for class_name, known in selected.items()
        }
        self.register_outputs({"deviceClasses": sorted(classes)})
