"""Exit statuses, as a table: the user's environment and input get 2 or 3 with one line saying what to do;
4 is only for bugs. Each row is a condition a reliability run found ending in 4, a hang, or a wrong 0."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cluster import verify
from common.cli import EXIT_UNAVAILABLE, EXIT_USAGE
from host import audit
from offline import render
from tests.support.fake_nvml import FakeGpu, fake_nvml
from tests.support.stacks import CLUSTER_YAML, EXPOSED, valid_config, write_stack

NODES = "  hidden-gpu:nodes: [{name: n, exposedGpus: []}]\n"


def render_stack(tmp_path: Path, text: str | None = None) -> int:
    path = tmp_path / "Pulumi.case.yaml"
    if not path.exists():
        write_stack(tmp_path, valid_config())
    if text is not None:
        path.write_text(text)
    return render.main(["--stack-file", str(path), "--out", str(tmp_path / "out")])


def failing_write(code: int) -> Callable[..., None]:
    def write(self: Path, *_args: object, **_kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(self))

    return write


@pytest.mark.parametrize(
    "case",
    [
        (errno.ENOSPC, EXIT_UNAVAILABLE, "No space left on device; free some space, then run again"),
        (errno.EDQUOT, EXIT_UNAVAILABLE, "free some space (disk quota)"),
        (errno.EROFS, EXIT_USAGE, "the file system is read-only: choose a writable path"),
        (errno.EACCES, EXIT_USAGE, "permission denied: choose a path you may use"),
    ],
    ids=["disk-full", "quota", "read-only-out", "unwritable-out"],
)
def test_an_out_the_machine_refuses(
    case: tuple[int, int, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, status, advice = case
    write_stack(tmp_path, valid_config())
    monkeypatch.setattr(Path, "write_text", failing_write(code))
    assert render_stack(tmp_path) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and advice in err and "internal error" not in err
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["Pulumi.case.yaml"]


def test_two_renders_racing_for_one_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert render_stack(tmp_path) == 0
    real_rename = Path.rename

    def raced(self: Path, target: str | os.PathLike[str]) -> Path:
        if Path(target).name == "out" and self.name.startswith(".out.new-"):  # the other run's out won
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(self), str(target))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", raced)
    capsys.readouterr()
    assert render_stack(tmp_path) == EXIT_USAGE
    assert "another run writing the same place?" in capsys.readouterr().err
    assert (tmp_path / "out" / ".hidden-gpu-output").exists()  # the previous output is back


@pytest.mark.parametrize(
    ("value", "kind"), [("!!binary aGVsbG8=", "!!binary"), ("!!set {a, b}", "!!set")], ids=["binary", "set"]
)
def test_yaml_types_pulumi_config_cannot_hold_in_another_namespace(
    value: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert render_stack(tmp_path, f"config:\n{CLUSTER_YAML}{NODES}  other:thing: {value}\n") == EXIT_USAGE
    assert f"config.other:thing: is a YAML {kind} value" in capsys.readouterr().err


def test_a_fifo_as_stack_file_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "Pulumi.fifo.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert render.main(["--stack-file", str(fifo), "--out", str(tmp_path / "out")]) == EXIT_USAGE
    assert time.monotonic() - started < 5
    assert "is not a regular file (a FIFO, device or directory?)" in capsys.readouterr().err


def test_a_binary_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    assert verify.main(["--stack", "prod", "--kubeconfig", str(kubeconfig)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: kubeconfig (context admin@prod): ") and err.count("\n") == 1


def test_a_metrics_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
    stack = write_stack(tmp_path, valid_config() | {"hidden-gpu:nodes": [valid_config()["hidden-gpu:nodes"][0]]})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--stack-file", str(stack), "--node", "gpu-node-01", "--proc-root", str(tmp_path / "proc")]
        args += ["--watch", "--metrics-port", str(port), "--metrics-address", "127.0.0.1"]
        assert audit.main(args, nvml=fake_nvml([FakeGpu(EXPOSED)])) == EXIT_USAGE
    assert "the port is in use: choose another" in capsys.readouterr().err


@contextmanager
def dripping_server() -> Iterator[int]:
    """An HTTP server that answers one byte a second: no socket read ever times out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    done = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            answer = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"items": ['
            connection.sendall(answer)
            while not done.wait(0.5):
                try:
                    connection.sendall(b" ")
                except OSError:
                    break
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        listener.close()


@pytest.mark.slow  # waits out its deadline or retries (1-2 s): make test-all
def test_a_server_that_drips_its_answer_is_cut_at_the_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with dripping_server() as port:
        from tests.support.fake_apiserver import kubeconfig_for  # noqa: PLC0415

        kubeconfig.write_text(kubeconfig_for(f"http://127.0.0.1:{port}"))
        started = time.monotonic()
        status = verify.main(
            ["--stack", "prod", "--kubeconfig", str(kubeconfig), "--context", "admin@test", "--deadline", "2"]
        )
        took = time.monotonic() - started
    # Cut at the deadline (the drip would take hours); 15 s leaves room for a cold client import on a loaded runner.
    assert status == EXIT_UNAVAILABLE and took < 15, took
    assert "did not finish answering GET /api/v1/nodes before the deadline" in capsys.readouterr().err
