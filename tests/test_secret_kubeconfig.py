"""`kubernetes:kubeconfig: {secure: ...}`, the Pulumi way to keep a cluster credential in a stack: verify and
release cannot decrypt it (only the Pulumi CLI can), so they take --kubeconfig, or the KUBECONFIG the
environment names and say so, or refuse in one line that names file, line and key and says what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import release, verify
from common.cli import EXIT_OK, EXIT_USAGE
from stack_config import read_stack_file
from tests.support.fake_apiserver import Cluster, serve
from tests.support.stacks import write_stack
from tests.support.verify_cluster import PROD, healthy
from tests.test_release import retired

SECRET = {"secure": "v1:c2VjcmV0LWNpcGhlcnRleHQ="}


def secret_stack(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """prod, its cluster's kubeconfig a secret (as `pulumi config set --secret` writes it: a block mapping)."""
    config = {**read_stack_file(PROD), "kubernetes:kubeconfig": SECRET, "kubernetes:context": "admin@test"}
    return write_stack(tmp_path, config, "prod"), config


def key_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "kubernetes:kubeconfig" in line)


@pytest.mark.parametrize("tool", ["verify", "release"])
def test_without_a_kubeconfig_it_says_what_to_do_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    path, _ = secret_stack(tmp_path)
    main = verify.main if tool == "verify" else release.main
    status = main(["--stack-file", str(path), *(["--node", "gpu-node-09"] if tool == "release" else [])])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}:{key_line(path)}: kubernetes:kubeconfig = {{secure: ...}}: a Pulumi secret")
    assert "--kubeconfig FILE (or KUBECONFIG=FILE)" in err
    assert "`pulumi config get kubernetes:kubeconfig --stack prod > FILE`" in err
    assert "Traceback" not in err and "dict" not in err and SECRET["secure"] not in err


def test_verify_takes_kubeconfig_over_the_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, config = secret_stack(tmp_path)
    cluster = healthy(config)
    with serve(tmp_path, cluster) as kubeconfig:
        status = verify.main(["--stack-file", str(path), "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    assert status == EXIT_OK, out + err
    assert err == "" and cluster.requests


@pytest.mark.parametrize("tool", ["verify", "release"])
def test_the_environments_kubeconfig_is_taken_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    path, config = secret_stack(tmp_path)
    cluster = healthy(config) if tool == "verify" else Cluster(nodes=[retired()])
    with serve(tmp_path, cluster) as kubeconfig:
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        if tool == "verify":
            status = verify.main(["--stack-file", str(path)])
        else:
            status = release.main(["--stack-file", str(path), "--node", "gpu-node-09"])
    out, err = capsys.readouterr()
    assert status == EXIT_OK, out + err
    assert err == (
        f"note: {path}:{key_line(path)}: kubernetes:kubeconfig is a Pulumi secret this tool cannot decrypt: "
        f"using KUBECONFIG ({kubeconfig}) for the stack's cluster\n"
    )
    assert cluster.requests
