"""Stack configuration: what a valid stack is (models), how it is read (load), how problems read (errors)."""

from stack_config.errors import ConfigError, InvalidConfigError, validated
from stack_config.load import load_stack_file, parse_project_config, read_stack_file
from stack_config.models import StackConfig, device_class_warnings, quota_warnings
from stack_config.node_config import NodeConfig
from stack_config.plugin_config import DevicePluginConfig

__all__ = [
    "ConfigError",
    "DevicePluginConfig",
    "InvalidConfigError",
    "NodeConfig",
    "StackConfig",
    "device_class_warnings",
    "load_stack_file",
    "parse_project_config",
    "quota_warnings",
    "read_stack_file",
    "validated",
]
