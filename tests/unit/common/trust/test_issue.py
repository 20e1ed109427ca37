"""``python -m gpufleet.common.trust.issue``: each part's folder, renewed only when due, and
the Secret manifests the Kubernetes certs Job applies."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from cryptography import x509

from gpufleet.common.trust import issue
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.peer import identity_from_auth_context


def secret(folder: Path, name: str) -> tuple[str, dict[str, bytes]]:
    manifest = json.loads((folder / f"{name}.json").read_text())
    assert manifest["apiVersion"] == "v1" and manifest["kind"] == "Secret"
    assert manifest["metadata"]["name"] == name
    return manifest["type"], {k: base64.b64decode(v) for k, v in manifest["data"].items()}


def leaf_of(chain: bytes) -> bytes:
    return chain.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"


def test_each_part_is_a_tls_secret_of_the_keys_cert_manager_writes(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    assert (
        issue.main(
            [
                "--dir",
                str(tmp_path / "work"),
                "--deployment",
                "k8s",
                "--parts",
                "scheduler,provisioner,machine:Box_1",
                "--kubernetes-secrets",
                str(out),
            ]
        )
        == 0
    )
    names = sorted(p.stem for p in out.iterdir())
    assert names == [
        "gpufleet-ca",
        "gpufleet-machine-box-1-tls",
        "gpufleet-machine-ca",
        "gpufleet-provisioner-tls",
        "gpufleet-scheduler-tls",
    ]
    kind, data = secret(out, "gpufleet-scheduler-tls")
    assert kind == "kubernetes.io/tls" and sorted(data) == ["ca.crt", "tls.crt", "tls.key"]
    assert identity_from_auth_context({"x509_pem_cert": [leaf_of(data["tls.crt"])]}) == Identity(
        Role.SCHEDULER, "k8s"
    )
    assert data["ca.crt"] == (tmp_path / "work" / "ca" / "ca.crt").read_bytes()
    kind, machine_ca = secret(out, "gpufleet-machine-ca")
    assert kind == "kubernetes.io/tls"
    assert machine_ca["tls.key"] == (tmp_path / "work" / "ca" / "machine-ca.key").read_bytes()
    kind, ca = secret(out, "gpufleet-ca")
    # A cert-manager CA Issuer's Secret: the root as tls.crt and tls.key.
    assert kind == "kubernetes.io/tls" and ca["deployment"] == b"k8s\n"
    assert ca["tls.key"] == (tmp_path / "work" / "ca" / "ca.key").read_bytes()
    assert ca["tls.crt"] == ca["ca.crt"] == data["ca.crt"]


def test_the_next_run_of_the_job_reuses_the_ca_of_the_secret_it_wrote(tmp_path: Path) -> None:
    """As the Job runs: a fresh folder, the gpufleet-ca Secret mounted (its keys as files)."""
    first = tmp_path / "first"
    args = ["--deployment", "k8s", "--parts", "reaper", "--kubernetes-secrets", str(tmp_path / "s1")]
    assert issue.main(["--dir", str(first), *args]) == 0
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for key, content in secret(tmp_path / "s1", "gpufleet-ca")[1].items():
        (mounted / key).write_bytes(content)
    second = tmp_path / "second"
    assert issue.main(["--dir", str(second), *args, "--ca-from", str(mounted)]) == 0
    for name in ("ca.crt", "ca.key", "machine-ca.crt", "machine-ca.key", "deployment"):
        assert (second / "ca" / name).read_bytes() == (first / "ca" / name).read_bytes(), name
    assert (second / "reaper" / "tls.crt").read_bytes() != (first / "reaper" / "tls.crt").read_bytes()


def test_a_later_run_reuses_the_ca_folder_it_is_given(tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert issue.main(["--dir", str(first), "--deployment", "k8s", "--parts", "reaper"]) == 0
    second = tmp_path / "second"
    assert (
        issue.main(
            ["--dir", str(second), "--deployment", "k8s", "--parts", "reaper", "--ca-from", str(first / "ca")]
        )
        == 0
    )
    assert (second / "ca" / "ca.crt").read_bytes() == (first / "ca" / "ca.crt").read_bytes()
    assert (second / "reaper" / "ca.crt").read_bytes() == (first / "ca" / "ca.crt").read_bytes()
    assert (second / "reaper" / "tls.crt").read_bytes() != (first / "reaper" / "tls.crt").read_bytes()
    # A first run: nothing to seed from, so a new CA.
    third = tmp_path / "third"
    assert (
        issue.main(
            [
                "--dir",
                str(third),
                "--deployment",
                "k8s",
                "--parts",
                "reaper",
                "--ca-from",
                str(tmp_path / "none"),
            ]
        )
        == 0
    )
    assert (third / "ca" / "ca.crt").read_bytes() != (first / "ca" / "ca.crt").read_bytes()


def test_run_again_it_keeps_what_is_good(tmp_path: Path) -> None:
    args = ["--dir", str(tmp_path), "--deployment", "compose", "--parts", "sweeper,provisioner"]
    assert issue.main(args) == 0
    kept = (tmp_path / "sweeper" / "tls.crt").read_bytes()
    assert issue.main(args) == 0
    assert (tmp_path / "sweeper" / "tls.crt").read_bytes() == kept
    assert (tmp_path / "provisioner" / "machine-ca.key").exists()
    cert = x509.load_pem_x509_certificate(kept)
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
