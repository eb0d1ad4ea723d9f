"""Stack configuration: the pydantic models and the readers that feed them."""

from stack_config.errors import PROJECT, ConfigError, InvalidConfigError
from stack_config.load import find_stack_file, load_stack_file, parse_project_config, read_stack_file, stack_name_of
from stack_config.models import DevicePluginConfig, NodeConfig, StackConfig, quota_warnings

__all__ = [
    "PROJECT",
    "ConfigError",
    "DevicePluginConfig",
    "InvalidConfigError",
    "NodeConfig",
    "StackConfig",
    "find_stack_file",
    "load_stack_file",
    "parse_project_config",
    "quota_warnings",
    "read_stack_file",
    "stack_name_of",
]
