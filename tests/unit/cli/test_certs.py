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


@pytest.mark.parametrize(
    ("args", "days"),
    [
        (["--role", "backend"], 30),
        (["--role", "machine", "--machine-id", "box-7"], 90),
        (["--role", "backend", "--days", "7"], 7),
    ],
)
def test_a_certificate_is_short_lived_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], days: int
) -> None:
    Authority.ensure(tmp_path / "var" / "tls", "dep")
    code, out, _ = issue(capsys, *args, "--state-dir", str(tmp_path / "var"), "--out", str(tmp_path / "out"))
    assert code == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "out" / "tls.crt").read_bytes())
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == days
    assert f"valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC" in out


def test_issuing_again_into_the_same_folder_renews_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """How a backend's certificate is renewed: the same command again (its process follows
    the files)."""
    Authority.ensure(tmp_path / "var" / "tls", "dep")
    args = ("--role", "backend", "--state-dir", str(tmp_path / "var"), "--out", str(tmp_path / "out"))
    assert issue(capsys, *args)[0] == 0
    first = (tmp_path / "out" / "tls.crt").read_bytes()
    assert issue(capsys, *args)[0] == 0
    assert (tmp_path / "out" / "tls.crt").read_bytes() != first


@pytest.mark.parametrize("days", ["0", "-3", "a week"])
def test_days_must_be_a_positive_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], days: str
) -> None:
    Authority.ensure(tmp_path / "var" / "tls", "dep")
    code, _, err = issue(
        capsys,
        "--role",
        "backend",
        "--days",
        days,
        "--state-dir",
        str(tmp_path / "var"),
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "--days" in err
