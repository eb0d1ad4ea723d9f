"""A kubernetes client for the stack's own cluster: its `kubernetes:context` and `kubernetes:kubeconfig`
unless the command line says otherwise, so a check never reads whatever cluster happens to be current."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from common.cli import UsageError

# Seconds: connect, then read; a check that cannot see must say so, not hang.
TIMEOUTS = (5.0, 30.0)


def add_cluster_options(arguments: argparse.ArgumentParser) -> None:
    arguments.add_argument("--kubeconfig", help="default: the stack's kubernetes:kubeconfig, else as kubectl finds it")
    arguments.add_argument("--context", help="default: the stack's kubernetes:context, else the current context")


def api_client(args: argparse.Namespace, stack_config: Mapping[str, Any]) -> client.ApiClient:
    """A client for the cluster the stack names; --kubeconfig/--context override the stack's keys."""
    context = args.context or stack_config.get("kubernetes:context")
    kubeconfig = args.kubeconfig or stack_config.get("kubernetes:kubeconfig")
    configuration = client.Configuration()
    try:
        if isinstance(kubeconfig, str) and "\n" in kubeconfig:  # the key may hold the file's content
            loaded = yaml.safe_load(kubeconfig)
            config.load_kube_config_from_dict(loaded, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            path = str(Path(kubeconfig).expanduser()) if kubeconfig else None
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, yaml.YAMLError, TypeError) as error:
        raise UsageError(f"kubeconfig (context {context or 'current'}): {error}") from None
    configuration.retries = False  # the callers retry, with backoff and a deadline
    return client.ApiClient(configuration)
