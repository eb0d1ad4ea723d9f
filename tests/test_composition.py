"""HiddenGpuNode composed by another program: the node's name and UUIDs fed from Outputs (issue 32, 5)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
from pulumi_policy import ReportViolation, StackValidationArgs
from pulumi_policy.proxy import UnknownValueError

from common.names import NVIDIA_DRA_DRIVER, VISIBLE_DEVICES_ENV, device_plugin_name, runtime_class_name
from common.tokens import Token
from components import GpuDeviceClasses, HiddenGpuNode, StackRecord
from desired.node_labels import device_selector
from desired.stack_claims import record_data
from offline.program import PatchWithoutNameError, ProgramRun, run_callable, run_program
from offline.sdk import UNKNOWN
from policy.rules import RESOURCE_VALIDATORS, plugin_nodes_have_label_patch
from stack_config.errors import InvalidInputError
from tests.support.objects import env_of, only, plugins
from tests.support.policy_pack import Collected, policy_resource, resource_args
from tests.support.stacks import EXPOSED, HIDDEN, changed, node

NAME = "gpu-node-01"
SECOND = HIDDEN[0]
Source = Callable[[Any], pulumi.Input[Any]]
NODE_KEYS = {"name": "node", "exposedGpus": "exposed", "hiddenGpus": "hidden"}


def plain(value: Any) -> Any:
    return value


def known(value: Any) -> pulumi.Output[Any]:
    return pulumi.Output.from_input(value)


def from_resource(value: Any) -> pulumi.Output[Any]:
    """What another resource of the consumer's reports (an inventory ConfigMap here): unknown in a preview."""
    inventory = k8s.core.v1.ConfigMap(f"inventory-{len(json.dumps(value))}", data={"value": json.dumps(value)})
    return inventory.data.apply(lambda data: json.loads(data["value"]))


def consumer(
    exposed: list[Any], hidden: list[Any], source: Source, name: str = NAME, name_source: Source = plain
) -> Callable[[], None]:
    def program() -> None:
        component = HiddenGpuNode(
            NAME,
            {
                "node": {"name": name_source(name), "exposedGpus": source(exposed), "hiddenGpus": source(hidden)},
                "device_plugin": {},
                "plugin_namespace": "hidden-gpu-system",
            },
        )
        pulumi.export("summary", component.summary)

    return program


def declared(run: ProgramRun) -> dict[str, dict[str, Any]]:
    """What the node's objects say, by URN: the consumer's own inventory left out."""
    return {r.urn: r.inputs for r in run.resources if not r.name.startswith("inventory-")}


def visible_devices(run: ProgramRun) -> str:
    pod = only(plugins(run)).inputs["spec"]["template"]["spec"]
    return env_of(pod["containers"][0])[VISIBLE_DEVICES_ENV]


@pytest.mark.parametrize("source", [known, from_resource], ids=["output", "resource-output"])
def test_uuids_and_name_from_outputs_declare_what_plain_values_do(source: Source) -> None:
    """Exactly the exposed UUIDs reach the plugin, and every object is the one the same plain values declare."""
    exposed, hidden = [EXPOSED, SECOND], HIDDEN[1:]
    composed = run_callable(consumer(exposed, hidden, source, name_source=source), "test")
    assert visible_devices(composed) == f"{EXPOSED},{SECOND}"
    reference = run_callable(consumer(exposed, hidden, plain), "test")
    assert declared(composed) == declared(reference)
    assert composed.outputs == reference.outputs
    assert composed.outputs["summary"]["exposedUuids"] == exposed


def test_a_stack_reference_feeds_the_node() -> None:
    """Another stack's outputs (an inventory stack's), read as `pulumi up` reads them: known in a preview too."""
    inventory = {"node": NAME, "exposed": [EXPOSED], "hidden": HIDDEN}
    live = {("pulumi:pulumi:StackReference", "org/gpu-inventory/prod"): {"outputs": inventory}}

    def program() -> None:
        outputs = pulumi.StackReference("org/gpu-inventory/prod")
        spec: Any = {key: outputs.get_output(of) for key, of in NODE_KEYS.items()}
        HiddenGpuNode(NAME, {"node": spec, "device_plugin": {}, "plugin_namespace": "hidden-gpu-system"})

    composed = run_callable(program, "test", live=live)
    assert declared(composed) == declared(run_callable(consumer([EXPOSED], HIDDEN, plain), "test"))
    assert visible_devices(run_callable(program, "test", live=live, preview=True)) == EXPOSED


def test_items_of_a_plain_list_may_be_outputs() -> None:
    def each(uuids: list[str]) -> list[pulumi.Output[Any]]:
        return [from_resource(uuid) for uuid in uuids]

    composed = run_callable(consumer([EXPOSED, SECOND], HIDDEN[1:], each), "test")
    assert visible_devices(composed) == f"{EXPOSED},{SECOND}"


def test_a_plain_empty_list_still_hides_every_gpu_of_a_node_named_by_an_output() -> None:
    composed = run_callable(consumer([], HIDDEN, plain, name_source=known), "test")
    assert [r.type for r in composed.resources if not r.name.startswith("inventory-")] == [
        Token.HIDDEN_GPU_NODE,
        Token.NODE_PATCH,
    ]
    assert only(composed.of_type(Token.NODE_PATCH)).inputs["metadata"]["name"] == NAME


def stack_file_problem(exposed: list[str], hidden: list[str]) -> str:
    """The problem the program's own path reports for the same node in a stack file, without its key path."""
    with pytest.raises(pulumi.RunError) as refused:
        run_program(changed(lambda c: node(c).update({"exposedGpus": exposed, "hiddenGpus": hidden})), "test")
    line = str(refused.value)
    assert "\n" not in line
    return line.split(" = ", 1)[1]


@pytest.mark.parametrize(
    ("exposed", "hidden", "where"),
    [
        (["GPU-1"], HIDDEN, "node.exposedGpus[0]"),
        ([EXPOSED], [EXPOSED], "node.hiddenGpus[0]"),
        ([EXPOSED, "0"], HIDDEN, "node.exposedGpus[1]"),
    ],
    ids=["not-a-uuid", "exposed-and-hidden", "an-index"],
)
@pytest.mark.parametrize("source", [known, from_resource], ids=["output", "resource-output"])
def test_a_bad_value_from_an_output_fails_in_the_stack_files_words(
    source: Source, exposed: list[str], hidden: list[str], where: str
) -> None:
    with pytest.raises(pulumi.RunError) as refused:
        run_callable(consumer(exposed, hidden, source), "test")
    problem = stack_file_problem(exposed, hidden)
    assert str(refused.value) == f"invalid inputs of HiddenGpuNode {NAME}: {where} = {problem}"


def test_a_bad_node_name_from_an_output_fails_in_one_line() -> None:
    with pytest.raises(pulumi.RunError) as refused:
        run_callable(consumer([EXPOSED], HIDDEN, plain, name="GPU_Node", name_source=known), "test")
    assert str(refused.value).startswith(f'invalid inputs of HiddenGpuNode {NAME}: node.name = "GPU_Node": not a valid')
    assert "\n" not in str(refused.value)


def test_an_output_that_turns_out_empty_fails_rather_than_run_a_plugin_for_no_gpu() -> None:
    """Whether the node runs a plugin is decided before the Output is known; an empty one must not reach it."""
    with pytest.raises(pulumi.RunError, match=r"node\.exposedGpus = \[\]: an Output that turned out empty"):
        run_callable(consumer([], HIDDEN, from_resource), "test")


def test_a_whole_node_given_as_an_output_is_refused_in_one_line() -> None:
    """Its shape decides which objects exist, so the node's entry is a plain mapping (a StackReference's whole
    `node` output is not): only its name and UUIDs may be Outputs."""
    live = {("pulumi:pulumi:StackReference", "org/gpu-inventory/prod"): {"outputs": {"node": {"name": NAME}}}}

    def program() -> None:
        spec: Any = pulumi.StackReference("org/gpu-inventory/prod").get_output("node")
        HiddenGpuNode(NAME, {"node": spec, "device_plugin": {}, "plugin_namespace": "hidden-gpu-system"})

    with pytest.raises(InvalidInputError) as refused:
        run_callable(program, "test", live=live)
    assert str(refused.value) == (
        "node: must be a plain mapping, not an Output: its name and UUIDs may be Outputs, its other keys may not"
    )


def test_a_misspelt_key_is_named_so_whatever_its_value() -> None:
    def program() -> None:
        spec: Any = {"name": NAME, "exposedGpus": known([EXPOSED]), "hidenGpus": known(HIDDEN), "pool": "a"}
        HiddenGpuNode(NAME, {"node": spec, "device_plugin": {}, "plugin_namespace": "hidden-gpu-system"})

    with pytest.raises(InvalidInputError) as refused:
        run_callable(program, "test")
    assert str(refused.value) == "node.hidenGpus: unknown key; did you mean 'hiddenGpus'?"


def test_keys_that_decide_which_objects_exist_refuse_outputs() -> None:
    def program() -> None:
        spec: Any = {"name": NAME, "exposedGpus": [EXPOSED], "timeSlicing": known({"replicas": 2})}
        HiddenGpuNode(NAME, {"node": spec, "device_plugin": {}, "plugin_namespace": "hidden-gpu-system"})

    with pytest.raises(InvalidInputError) as refused:
        run_callable(program, "test")
    assert (
        str(refused.value)
        == "node.timeSlicing: must be a plain value, not an Output: it decides which objects the node gets"
    )


def unknown_at(value: Any, *path: str | int) -> bool:
    """Whether the value at `path` is unknown: it, or an object or list holding it."""
    for key in path:
        if value == UNKNOWN:
            return True
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return False
    return bool(value == UNKNOWN)


@pytest.mark.parametrize("name_source", [plain, known], ids=["plain-name", "known-output-name"])
def test_a_preview_that_does_not_know_the_uuids_leaves_their_fields_unknown_and_names_the_objects(
    name_source: Source,
) -> None:
    """Fail closed: never an empty NVIDIA_VISIBLE_DEVICES or a default, which a runtime may read as every GPU. The
    name is known all the same: the provider's check refuses a patch without one, in a preview too (the mocks do
    as it does), and would name the other objects itself."""
    previewed = run_callable(consumer([EXPOSED], HIDDEN, from_resource, name_source=name_source), "test", preview=True)
    daemonset = only(plugins(previewed)).inputs
    assert unknown_at(daemonset, "spec", "template", "spec", "containers")
    assert daemonset["metadata"]["name"] == device_plugin_name(NAME)
    patch = only(previewed.of_type(Token.NODE_PATCH)).inputs
    assert patch["metadata"]["name"] == NAME
    assert unknown_at(patch, "metadata", "labels")
    runtime_class = only(previewed.of_type(Token.RUNTIME_CLASS)).inputs
    assert runtime_class["metadata"]["name"] == runtime_class_name(NAME)
    assert unknown_at(runtime_class, "scheduling")
    assert VISIBLE_DEVICES_ENV not in json.dumps(list(declared(previewed).values()))


def test_a_preview_that_does_not_know_the_name_fails_at_the_label_patch() -> None:
    """As `pulumi preview` does with the Kubernetes provider: the name must be known at preview time
    (docs/operations.md), not an Output of a resource being created."""
    with pytest.raises(PatchWithoutNameError, match=r"require the `\.metadata\.name` field to be set"):
        run_callable(consumer([EXPOSED], HIDDEN, plain, name_source=from_resource), "test", preview=True)


def test_a_preview_that_knows_the_outputs_declares_them_and_validates_them() -> None:
    previewed = run_callable(consumer([EXPOSED], HIDDEN, known, name_source=known), "test", preview=True)
    assert visible_devices(previewed) == EXPOSED
    with pytest.raises(pulumi.RunError, match="not a GPU UUID"):
        run_callable(consumer(["GPU-1"], HIDDEN, known), "test", preview=True)


def policy_verdicts(run: ProgramRun) -> list[str]:
    """Each policy of the pack over what the run declared, as the pack sees it: a violation's message, or `unknown`
    where the policy cannot run in this preview (the pack then says so, and judges the `up`)."""
    verdicts: list[str] = []
    objects = [r for r in run.resources if r.is_kubernetes_object]

    def judge(validate: Callable[[Any, ReportViolation], None], args: Any) -> None:
        found = Collected()
        try:
            validate(args, found)
        except UnknownValueError:
            verdicts.append("unknown")
        verdicts.extend(found)

    for _, validate in RESOURCE_VALIDATORS.values():
        for resource in objects:
            judge(validate, resource_args(resource.type, resource.inputs))
    # The consumer declares no guard here: the guard's stack policies would rightly refuse it.
    judge(plugin_nodes_have_label_patch, StackValidationArgs([policy_resource(r) for r in objects]))
    return verdicts


def test_the_policy_pack_accepts_a_composed_node_and_waits_for_what_a_preview_does_not_know() -> None:
    composed = consumer([EXPOSED], HIDDEN, from_resource, name_source=known)
    assert policy_verdicts(run_callable(composed, "test")) == []
    assert set(policy_verdicts(run_callable(composed, "test", preview=True))) == {"unknown"}


def test_a_stack_record_and_device_classes_take_the_composed_nodes_outputs() -> None:
    """What else names a node's UUIDs takes them as Outputs too: the record from the node's summary, a DeviceClass's
    selector from the same Output the node got."""

    def program(exposed: Source) -> Callable[[], None]:
        def declare() -> None:
            uuids = exposed([EXPOSED, SECOND])
            component = HiddenGpuNode(
                NAME, {"node": {"name": NAME, "exposedGpus": uuids}, "device_plugin": {}, "plugin_namespace": "ns"}
            )
            record: pulumi.Input[Any] = component.summary.apply(lambda summary: {NAME: summary["exposedUuids"]})
            StackRecord("record", {"stack": "test", "namespace": "ns", "exposed": record})
            GpuDeviceClasses("classes", {"driver": NVIDIA_DRA_DRIVER, "classes": {runtime_class_name(NAME): uuids}})

        return declare

    composed, reference = run_callable(program(from_resource), "test"), run_callable(program(plain), "test")
    assert declared(composed) == declared(reference)
    record_map = only([r for r in composed.resources if r.name == "record-config-map"])
    assert record_map.inputs["data"] == record_data("test", {NAME: [EXPOSED, SECOND]})
    selector = only(composed.of_type(Token.DEVICE_CLASS)).inputs["spec"]["selectors"][0]["cel"]["expression"]
    assert selector == device_selector(NVIDIA_DRA_DRIVER, [EXPOSED, SECOND])

    previewed = run_callable(program(from_resource), "test", preview=True)
    assert unknown_at(only(previewed.of_type(Token.DEVICE_CLASS)).inputs, "spec", "selectors", 0, "cel", "expression")
    assert unknown_at(only([r for r in previewed.resources if r.name == "record-config-map"]).inputs, "data")


def test_a_bad_uuid_of_a_device_class_from_an_output_fails_in_one_line() -> None:
    def program() -> None:
        GpuDeviceClasses("classes", {"driver": NVIDIA_DRA_DRIVER, "classes": {"hidden-gpu-a": from_resource(["all"])}})

    with pytest.raises(pulumi.RunError) as refused:
        run_callable(program, "test")
    assert str(refused.value) == (
        'invalid inputs of GpuDeviceClasses classes: classes.hidden-gpu-a[0] = "all": not a GPU: list each GPU by its UUID'
    )


def test_every_bad_plain_device_class_is_reported_before_any_class_is_declared() -> None:
    refused: list[str] = []

    def program() -> None:
        classes: Any = {"hidden-gpu-a": [EXPOSED], "hidden-gpu-b": ["all"], "hidden-gpu-c": ["GPU-1"]}
        try:
            GpuDeviceClasses("classes", {"driver": NVIDIA_DRA_DRIVER, "classes": classes})
        except InvalidInputError as error:  # caught, so the run's record shows what was declared before it
            refused.append(str(error))

    run = run_callable(program, "test")
    assert refused[0].splitlines() == [
        'classes.hidden-gpu-b[0] = "all": not a GPU: list each GPU by its UUID',
        f"classes.hidden-gpu-c[0] = {stack_file_problem(['GPU-1'], HIDDEN)}",
    ]
    assert run.of_type(Token.DEVICE_CLASS) == []
