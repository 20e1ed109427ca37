"""`gpufleet certs issue`: a certificate of the deployment's CA for a part that is not
started by `gpufleet up` (a product backend, a registered box, the trace collector)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.cli.main import main
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.pki import Authority


def issue(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(["certs", "issue", *args])
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def read_back(folder: Path) -> tuple[Identity | None, list[str]]:
    pem = (folder / "tls.crt").read_bytes()
    leaf = pem.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    names = x509.load_pem_x509_certificate(leaf).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return identity_from_auth_context({"x509_pem_cert": [leaf]}), names.value.get_values_for_type(
        x509.DNSName
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--role", "backend"], Identity(Role.BACKEND, "dep")),
        (["--role", "collector"], Identity(Role.COLLECTOR, "dep")),
        (["--role", "metrics"], Identity(Role.METRICS, "dep")),
        (["--role", "machine", "--machine-id", "box-7"], Identity(Role.MACHINE, "dep", "box-7")),
    ],
)
def test_a_part_gets_a_certificate_that_reads_back_as_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: Identity
) -> None:
    Authority.ensure(tmp_path / "var" / "tls", "dep")
    code, out, _ = issue(capsys, *args, "--state-dir", str(tmp_path / "var"), "--out", str(tmp_path / "out"))
    assert code == 0
    assert f"GPUFLEET_TLS_CERT_FILE={tmp_path / 'out' / 'tls.crt'}" in out
    identity, names = read_back(tmp_path / "out")
    assert identity == expected
    assert names[0] == expected.server_name


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--role", "machine"], "--machine-id goes with --role machine"),
        (["--role", "backend", "--machine-id", "box-1"], "--machine-id goes with --role machine"),
        (["--role", "machine", "--machine-id", "no spaces"], "--machine-id"),
    ],
)
def test_a_machine_id_goes_with_a_machine_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    Authority.ensure(tmp_path / "var" / "tls", "dep")
    code, _, err = issue(capsys, *args, "--state-dir", str(tmp_path / "var"), "--out", str(tmp_path / "out"))
    assert code == 2 and says in err
    assert not (tmp_path / "out" / "tls.crt").exists()


def test_no_ca_yet_says_how_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = issue(
        capsys, "--role", "backend", "--state-dir", str(tmp_path / "var"), "--out", str(tmp_path)
    )
    assert code == 2 and "gpufleet up" in err
