"""Time-slicing and MIG on a hidden node: config rules, the plugin's config, env and outputs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common.names import CONFIG_CHECKSUM_ANNOTATION, DEFAULT_PLUGIN_NAMESPACE, plugin_config_name
from common.tokens import Token
from host import discover
from offline import render
from offline.program import Declared, ProgramRun, run_program
from stack_config import InvalidConfigError, parse_project_config, quota_warnings
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.guard import admit, plugin_pod, pod_policy
from tests.support.objects import env_of, only, plugins
from tests.support.stacks import (
    CLUSTER,
    EXPOSED,
    HIDDEN,
    MIG_A,
    MIG_B,
    PARENT,
    changed,
    dra_allocated,
    node,
    time_sliced,
    with_mig,
)


def plugin_configs(run: ProgramRun) -> list[Declared]:
    """The plugin's ConfigMaps: every ConfigMap but the stack's record."""
    return [r for r in run.of_type(Token.CONFIG_MAP) if Token.STACK_RECORD not in r.parent]


def plugin(run: ProgramRun) -> tuple[dict[str, Any], dict[str, Any]]:
    daemonset = only(plugins(run)).inputs
    return daemonset, daemonset["spec"]["template"]["spec"]


def test_time_slicing_config_map_field_by_field() -> None:
    run = run_program(time_sliced(4, renameByDefault=True), "test")
    config_map = only(plugin_configs(run)).inputs
    assert config_map["metadata"] == {
        "name": plugin_config_name("gpu-node-01"),
        "namespace": DEFAULT_PLUGIN_NAMESPACE,
        "labels": config_map["metadata"]["labels"],
    }
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["version"] == "v1"
    assert config["flags"] == {"migStrategy": "none"}
    slicing = config["sharing"]["timeSlicing"]
    assert slicing["renameByDefault"] is True
    assert slicing["failRequestsGreaterThanOne"] is False
    assert slicing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert "devices" not in slicing["resources"][0]  # the plugin ignores it; pinning does the choosing


def test_plugin_mounts_its_config_and_rolls_when_it_changes() -> None:
    run = run_program(time_sliced(4), "test")
    daemonset, pod = plugin(run)
    container = pod["containers"][0]
    assert env_of(container)["CONFIG_FILE"] == "/etc/nvidia-device-plugin/config.yaml"
    assert {"name": "plugin-config", "mountPath": "/etc/nvidia-device-plugin", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "plugin-config", "configMap": {"name": plugin_config_name("gpu-node-01")}} in pod["volumes"]
    content = only(plugin_configs(run)).inputs["data"]["config.yaml"]
    checksum = daemonset["spec"]["template"]["metadata"]["annotations"][CONFIG_CHECKSUM_ANNOTATION]
    assert checksum == hashlib.sha256(content.encode()).hexdigest()
    other, _ = plugin(run_program(time_sliced(8), "test"))
    assert other["spec"]["template"]["metadata"]["annotations"][CONFIG_CHECKSUM_ANNOTATION] != checksum
    assert only(plugin_configs(run)).urn in only(plugins(run)).dependencies


def test_no_config_without_time_slicing(run: ProgramRun) -> None:
    daemonset, pod = plugin(run)
    assert plugin_configs(run) == []
    assert "CONFIG_FILE" not in env_of(pod["containers"][0])
    assert "annotations" not in daemonset["spec"]["template"]["metadata"]


def test_advertised_count_in_outputs_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = time_sliced(4)
    assert run_program(config, "test").outputs["nodes"]["gpu-node-01"]["advertisedCount"] == 4
    stack_file = tmp_path / "Pulumi.ts.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    assert render.main(["--stack-file", str(stack_file), "--out", str(tmp_path / "out")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["gpu-node-01", "1", "4", "2", "5"] in rows  # exposed, advertised, hidden, objects


def test_quota_above_what_the_nodes_advertise_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-team": 1, "big-team": 3}))
    assert quota_warnings(parse_project_config(config)) == [
        "hidden-gpu:quotas.big-team = 3: more than the 1 nvidia.com/gpu this stack's nodes advertise"
    ]
    sliced = time_sliced(4)
    sliced["hidden-gpu:quotas"] = {"big-team": 3}
    assert quota_warnings(parse_project_config(sliced)) == []
    stack_file = tmp_path / "Pulumi.q.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}))
    assert render.main(["--stack-file", str(stack_file), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("warning: hidden-gpu:quotas.big-team = 3")


def test_a_quota_is_judged_by_each_allocator_apart() -> None:
    """A quota caps nvidia.com/gpu and each DRA class apart: a DRA node's GPUs count for its class, not for the
    plugin's resource (which it advertises none of)."""
    config = dra_allocated(changed(lambda c: c.__setitem__("hidden-gpu:quotas", {"ml-team": 1, "big-team": 3})))
    assert quota_warnings(parse_project_config(config)) == [
        "hidden-gpu:quotas.big-team = 3: more than the 1 GPUs any one allocator of this stack hands out "
        "(0 nvidia.com/gpu, its DeviceClasses 1)"
    ]
    assert run_program(config, "test").outputs["nodes"]["gpu-node-01"]["advertisedCount"] == 0


def test_mig_strategy_env_and_capability() -> None:
    _, pod = plugin(run_program(with_mig("mixed"), "test"))
    container = pod["containers"][0]
    env = env_of(container)
    assert env["MIG_STRATEGY"] == "mixed"
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{EXPOSED},{MIG_A},{MIG_B}"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert container["securityContext"]["privileged"] is False


def test_no_mig_means_no_capability(run: ProgramRun) -> None:
    container = plugin(run)[1]["containers"][0]
    assert env_of(container)["MIG_STRATEGY"] == "none"
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env_of(container)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_mig_plugin_is_admitted_only_in_its_namespace() -> None:
    """SYS_ADMIN is what the guard denies tenants; the plugin's namespace is exempt."""
    run = run_program(with_mig("single"), "test")
    mig_plugin = plugin_pod(run)
    assert admit(pod_policy(run), mig_plugin, DEFAULT_PLUGIN_NAMESPACE) is None
    assert "capabilities" in str(admit(pod_policy(run), mig_plugin, "ml-team"))


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_sharing_objects_pass_strict_schemas(version: str) -> None:
    config = with_mig("single")
    node(config)["timeSlicing"] = {"replicas": 2}
    for resource in run_program(config, "test").kubernetes_objects:
        kubernetes_validate.validate(resource.inputs, version, strict=True)


MIG_REJECTIONS = [
    (
        "malformed-mig-uuid",
        with_mig(exposed=["MIG-123"]),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        "not a MIG device UUID",
    ),
    (
        "legacy-mig-format",
        with_mig(exposed=[f"MIG-{PARENT}/1/0"]),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        "not a MIG device UUID",
    ),
    (
        "mig-without-strategy",
        with_mig("none"),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        "needs migStrategy single or mixed",
    ),
    (
        "mig-parent-unknown",
        changed(lambda c: node(c).update({"exposedGpus": [MIG_A], "migStrategy": "single"})),
        "hidden-gpu:nodes[0].exposedGpus[0]",
        "parent GPU unknown",
    ),
    (
        "slice-exposed-sibling-hidden",
        with_mig(exposed=[MIG_A], hidden=[MIG_B]),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        f"but {MIG_B} of the same GPU",
    ),
    (
        "parent-exposed-slice-hidden",
        with_mig(exposed=[PARENT], hidden=[MIG_A]),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        f"but {MIG_A} of the same GPU",
    ),
    (
        "slice-exposed-parent-hidden",
        with_mig(exposed=[MIG_A], hidden=[PARENT]),
        "hidden-gpu:nodes[0].exposedGpus[1]",
        f"but {PARENT} of the same GPU",
    ),
    (
        "strategy-unknown",
        with_mig("all"),
        "hidden-gpu:nodes[0].migStrategy",
        "must be one of 'none', 'single' or 'mixed'",
    ),
    (
        "time-slicing-with-mixed",
        changed(lambda c: node(c).update({"migStrategy": "mixed", "timeSlicing": {"replicas": 2}})),
        "hidden-gpu:nodes[0].timeSlicing",
        "use migStrategy single",
    ),
    ("replicas-below-two", time_sliced(1), "hidden-gpu:nodes[0].timeSlicing.replicas", "must be at least 2"),
    (
        "replicas-not-a-number",
        time_sliced("four"),
        "hidden-gpu:nodes[0].timeSlicing.replicas",
        "must be a whole number",
    ),
    (
        "time-slicing-misspelt",
        time_sliced(2, renameByDefalt=True),
        "hidden-gpu:nodes[0].timeSlicing.renameByDefalt",
        "did you mean 'renameByDefault'?",
    ),
]


@pytest.mark.parametrize(
    ("config", "key", "reason"), [case[1:] for case in MIG_REJECTIONS], ids=[case[0] for case in MIG_REJECTIONS]
)
def test_sharing_rejections(config: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_project_config(config)
    first = str(raised.value.errors[0])
    assert first.startswith(key) and reason in first and "\n" not in first, first
    assert all(str(error).startswith("hidden-gpu:") for error in raised.value.errors)


def test_valid_mig_layouts_are_accepted() -> None:
    for config, exposed in (
        (with_mig("mixed"), [EXPOSED, MIG_A, MIG_B]),
        (with_mig("single", exposed=[PARENT]), [EXPOSED, PARENT]),
        (with_mig("mixed", exposed=[], hidden=[PARENT, MIG_A, MIG_B]), [EXPOSED]),
    ):
        assert parse_project_config(config).nodes[0].exposed_gpus == exposed


def test_discover_exposes_a_mig_gpu_by_its_mig_devices(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = [FakeGpu(EXPOSED), FakeGpu(PARENT, mig_uuids=[MIG_A, None, MIG_B]), FakeGpu(HIDDEN[0], mig_uuids=[])]
    assert discover.main(["--expose", "1", "--node", "gpu-node-01"], nvml=fake_nvml(gpus)) == 0
    entry = yaml.safe_load(capsys.readouterr().out)[0]
    assert entry == {
        "name": "gpu-node-01",
        "exposedGpus": [MIG_A, MIG_B],
        "hiddenGpus": [EXPOSED, HIDDEN[0]],
        "migStrategy": "mixed",
        "migDevices": {PARENT: [MIG_A, MIG_B]},
    }
    parse_project_config({**CLUSTER, "hidden-gpu:nodes": [entry]})


def test_cdi_cri_plugin_writes_its_spec_and_stays_unprivileged() -> None:
    """The GPU Operator's CDI mode: the pinned plugin answers with CDI names and writes a spec of the
    GPUs it sees (only the exposed ones); it needs the host's CDI directory and the driver root."""
    keys = {"deviceListStrategy": "cdi-cri", "nvidiaDriverRoot": "/run/nvidia/driver"}
    keys["nvidiaCdiHookPath"] = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    run = run_program(changed(lambda c: c["hidden-gpu:devicePlugin"].update(keys)), "test")
    daemonset, pod = plugin(run)
    container = pod["containers"][0]
    env = env_of(container)
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-cri" and env["NVIDIA_VISIBLE_DEVICES"] == EXPOSED
    assert env["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver" and env["CONTAINER_DRIVER_ROOT"] == "/driver-root"
    assert env["NVIDIA_CDI_HOOK_PATH"] == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    assert volumes["driver-root"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    assert volumes["cdi-root"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    assert {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True} in container["volumeMounts"]
    assert container["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    for version in ("1.30", "1.37"):
        kubernetes_validate.validate(daemonset, version, strict=True)


def test_driver_root_only_with_cdi_cri_or_a_dra_node() -> None:
    """The pinned DRA kubelet plugin reads NVML under it too (issue 41: the GPU host's NVML is in
    /usr/local/nvidia/lib64): its DaemonSet mounts that root; elsewhere the key means nothing and is refused."""
    config = changed(lambda c: c["hidden-gpu:devicePlugin"].update({"nvidiaDriverRoot": "/run/nvidia/driver"}))
    with pytest.raises(InvalidConfigError, match="only means something with deviceListStrategy cdi-cri or a node"):
        parse_project_config(config)
    run = run_program(dra_allocated(config), "test")
    (plugin,) = [r.inputs for r in run.of_type(Token.DAEMONSET) if "dra-kubelet-plugin" in r.inputs["metadata"]["name"]]
    volumes = {v["name"]: v["hostPath"]["path"] for v in plugin["spec"]["template"]["spec"]["volumes"]}
    assert volumes["driver-root"] == "/run/nvidia/driver"
