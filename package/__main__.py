"""hidden-gpu's components as a Pulumi component provider, for programs in any language.

    pulumi package add ./package        # in a consumer project; then use hidden-gpu:index:GpuPool, ...

Pulumi's Python language host runs this file (PulumiPlugin.yaml beside it) in a virtualenv of its own, package/venv,
into which it installs requirements.txt beside it: the components as this repository's distribution (pyproject.toml),
pinned as the project pins them; nothing of the checkout's .venv or sys.path. The schema is what Pulumi's analyzer
infers from the components' annotations (tests/test_program.py checks it reads every one).
"""

import tomllib
from pathlib import Path

from pulumi.provider.experimental import component_provider_host

from common.names import PROJECT
from components.access_guard import AccessGuard
from components.device_classes import GpuDeviceClasses
from components.gpu_pool import GpuPool
from components.gpu_quotas import GpuQuotas
from components.hidden_gpu_node import HiddenGpuNode
from components.plugin_namespace import PluginNamespace
from components.stack_record import StackRecord
from components.toolkit_settings import ToolkitSettings

COMPONENTS = [
    AccessGuard,
    GpuDeviceClasses,
    GpuPool,
    GpuQuotas,
    HiddenGpuNode,
    PluginNamespace,
    StackRecord,
    ToolkitSettings,
]
# One version for both distributions: the provider's and the Python wheel's (pyproject.toml).
VERSION: str = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"][
    "version"
]

if __name__ == "__main__":
    component_provider_host(COMPONENTS, name=PROJECT, version=VERSION)
