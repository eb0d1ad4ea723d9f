"""examples/pulumi-kubernetes-operator/prod.yaml as its workspace would run it (issue 42, 3): the example's
ServiceAccount, ClusterRole, bindings and kubeconfig ConfigMap applied to the real API server; then the prod stack,
as stacks/Pulumi.prod.yaml writes it (`kubernetes:context: admin@prod`, no kubeconfig), refreshed and `up`ped by the
real engine under that service account's token, through the example's kubeconfig with its server, CA and token paths
pointed here. The operator and its workspace pod do not run here: no version of
github.com/pulumi/pulumi-kubernetes-operator/v2 is served by the module proxy, and the Stack kind is not installed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.names import DEVICE_PLUGIN_LABEL, NODE_SWITCHES_POLICY_NAME, POLICY_NAME, device_plugin_name
from e2e.controlplane import ControlPlane
from tests.real.conftest import seeded_plane, set_node_status
from tests.real.harness import pulumi_stack

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pulumi-kubernetes-operator" / "prod.yaml"
NAMESPACE = "pulumi-kubernetes-operator"


def documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc]


@pytest.fixture(scope="module")
def workspace(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Path]]:
    """A plane with the example's objects, and a kubeconfig as the workspace pod reads it."""
    with seeded_plane(bin_dir) as plane:
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for doc in documents():
            if doc["kind"] != "Stack":  # the operator's kind: not installed here
                plane.apply(doc)
        account = next(d for d in documents() if d["kind"] == "ServiceAccount")["metadata"]["name"]
        token = plane.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
        pod = tmp_path_factory.mktemp("workspace-pod")
        (pod / "token").write_text(token)
        shutil.copy(plane.root / "pki/ca.crt", pod / "ca.crt")
        config_map = next(d for d in documents() if d["kind"] == "ConfigMap")
        kubeconfig = yaml.safe_load(config_map["data"]["kubeconfig"])
        # The pod's paths and the in-cluster address, here; every name as the example writes it.
        cluster = kubeconfig["clusters"][0]["cluster"]
        cluster["server"], cluster["certificate-authority"] = plane.url, str(pod / "ca.crt")
        kubeconfig["users"][0]["user"]["tokenFile"] = str(pod / "token")
        (pod / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        yield plane, pod / "kubeconfig"


def test_the_prod_stack_goes_up_under_the_examples_identity_and_kubeconfig(
    workspace: tuple[ControlPlane, Path], tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane, kubeconfig = workspace
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # the Stack's workspaceTemplate env
    work = tmp_path_factory.mktemp("prod")
    prod = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    assert prod["config"]["kubernetes:context"] == "admin@prod" and "kubernetes:kubeconfig" not in prod["config"]
    shutil.copy(ROOT / "stacks" / "Pulumi.prod.yaml", work / "Pulumi.prod.yaml")
    for node in prod["config"]["hidden-gpu:nodes"]:
        set_node_status(plane, node["name"], len(node["exposedGpus"]))
    stack = pulumi_stack(work, "prod")
    stack.refresh(on_output=None)  # the Stack's `refresh: true`
    stack.up(on_output=None)
    # Every object written under the workspace's identity: the switches, the plugin, the guard.
    node = plane.request("GET", "/api/v1/nodes/gpu-node-01")["metadata"]["labels"]
    assert node[DEVICE_PLUGIN_LABEL] == "false"
    assert plane.get_or_none(
        f"/apis/apps/v1/namespaces/hidden-gpu-system/daemonsets/{device_plugin_name('gpu-node-01')}"
    )
    for name in (POLICY_NAME, NODE_SWITCHES_POLICY_NAME):
        assert plane.get_or_none(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}")
    stack.preview(expect_no_changes=True, on_output=None)
