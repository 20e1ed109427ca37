"""The operator certificate a CLI command calls with, from `gpufleet up`'s state dir: renewed
in place by the first command that finds it due, kept otherwise."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.cli.credentials import tls_dir, transport_for
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority
from gpufleet.common.trust.transport import TransportNotConfigured

OPERATOR = Identity(Role.OPERATOR, "local")


@pytest.fixture(autouse=True)
def no_tls_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state dir is used only when the environment names no certificate."""
    for name in ("GPUFLEET_TLS_CA_FILE", "GPUFLEET_TLS_CERT_FILE", "GPUFLEET_TLS_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


def not_after(path: Path) -> datetime.datetime:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


def test_an_operator_certificate_nearing_its_expiry_is_renewed_by_the_next_command(tmp_path: Path) -> None:
    weeks_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=25)
    Authority.ensure(tls_dir(tmp_path), "local", now=lambda: weeks_ago).ensure_part(OPERATOR, "operator")
    old = (tls_dir(tmp_path) / "operator.crt").read_bytes()

    transport = transport_for(tmp_path)
    assert transport.files is not None
    assert transport.files.cert.read_bytes() != old
    assert not_after(transport.files.cert) > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=29)
    assert transport.tls.current().cert == transport.files.cert.read_bytes()


def test_a_good_operator_certificate_is_kept(tmp_path: Path) -> None:
    files = Authority.ensure(tls_dir(tmp_path), "local").ensure_part(OPERATOR, "operator")
    kept = files.cert.read_bytes()
    transport_for(tmp_path)
    assert files.cert.read_bytes() == kept


def test_a_key_left_beside_another_certificate_is_mended(tmp_path: Path) -> None:
    """What two writers racing could leave: the next command issues a whole pair again."""
    authority = Authority.ensure(tls_dir(tmp_path), "local")
    files = authority.ensure_part(OPERATOR, "operator")
    other = authority.ensure_part(Identity(Role.BACKEND, "local"))
    shutil.copy(other.key, files.key)
    transport = transport_for(tmp_path)
    # The reader refuses a key that is not its certificate's: it loads, so the pair is whole.
    assert transport.tls.current().key == files.key.read_bytes() != other.key.read_bytes()


def test_no_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(TransportNotConfigured, match="gpufleet up"):
        transport_for(tmp_path / "none")
