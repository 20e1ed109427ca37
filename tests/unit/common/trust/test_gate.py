"""The authorization gate decides a method once per certificate (a connection's identity
cannot change), and never lets a decision stand in for another certificate's."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest

from gpufleet.common.metrics.catalog import AUTH_REFUSALS
from gpufleet.common.trust import authz
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.interceptor import Gate, Refused
from gpufleet.common.trust.pki import Authority, TlsFiles, issue_with
from tests.support.metrics import MetricsProbe

SUBMIT = "/gpufleet.v1.JobService/SubmitJob"
PEER = "ipv4:127.0.0.1:40000"


def auth_of(files: TlsFiles) -> dict[str, list[bytes]]:
    """What grpc's auth_context holds for a peer that presented this certificate."""
    leaf = files.cert.read_bytes().split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    return {"x509_pem_cert": [leaf]}


class CountingRules(Mapping[str, frozenset[Role]]):
    """The real table, counting how often a decision consults it."""

    def __init__(self) -> None:
        self.lookups = 0

    def __getitem__(self, method: str) -> frozenset[Role]:
        self.lookups += 1
        return authz.RULES[method]

    def __iter__(self) -> Iterator[str]:
        return iter(authz.RULES)

    def __len__(self) -> int:
        return len(authz.RULES)


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority.ensure(tmp_path / "tls", "local")


def test_a_certificate_is_decided_once_per_method(authority: Authority) -> None:
    rules = CountingRules()
    gate = Gate("local", rules)
    backend = auth_of(authority.ensure_part(Identity(Role.BACKEND, "local")))
    for _ in range(5):
        assert gate.check(SUBMIT, backend, PEER) == Identity(Role.BACKEND, "local")
    assert rules.lookups == 1
    gate.check("/gpufleet.v1.JobService/GetJob", backend, PEER)
    assert rules.lookups == 2


def test_every_refusal_is_decided_logged_and_refused_again(
    authority: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    rules = CountingRules()
    gate = Gate("local", rules)
    machine = auth_of(authority.ensure_part(Identity(Role.MACHINE, "local", "m-1")))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with pytest.raises(Refused) as refused:
                gate.check(SUBMIT, machine, PEER)
            assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert rules.lookups == 3
    refusals = [r.getMessage() for r in caplog.records]
    assert refusals == [f"refused {SUBMIT} to machine:m-1 (wrong_role)"] * 3


def test_an_allowance_never_stands_in_for_another_certificate_from_the_same_address(
    authority: Authority, tmp_path: Path
) -> None:
    """A later connection may come from the address of an earlier one: a certificate the
    machine CA signed for a scheduler is refused even right after the real scheduler's."""
    gate = Gate("local")
    real = auth_of(authority.ensure_part(Identity(Role.SCHEDULER, "local")))
    forged = TlsFiles(authority.ca_path, tmp_path / "s.crt", tmp_path / "s.key")
    issue_with(
        authority.machine_signer(), authority.ca_path.read_bytes(), Identity(Role.SCHEDULER, "local"), forged
    )
    method = "/gpufleet.v1.ProvisionerService/CreateInstance"
    assert gate.check(method, real, PEER).role is Role.SCHEDULER
    with pytest.raises(Refused) as refused:
        gate.check(method, auth_of(forged), PEER)
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED


def test_another_deployment_is_refused_every_time(authority: Authority) -> None:
    gate = Gate("prod")
    local = auth_of(authority.ensure_part(Identity(Role.BACKEND, "local")))
    for _ in range(2):
        with pytest.raises(Refused) as refused:
            gate.check(SUBMIT, local, PEER)
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED


def test_each_refusal_is_counted_by_method_and_reason(authority: Authority) -> None:
    probe = MetricsProbe()
    gate = Gate("local", instruments=probe.instruments)
    machine = auth_of(authority.ensure_part(Identity(Role.MACHINE, "local", "m-1")))
    elsewhere = auth_of(authority.ensure_part(Identity(Role.BACKEND, "local")))
    for auth in (machine, machine):
        with pytest.raises(Refused):
            gate.check(SUBMIT, auth, PEER)
    with pytest.raises(Refused):
        Gate("prod", instruments=probe.instruments).check(SUBMIT, elsewhere, PEER)
    gate.check(SUBMIT, elsewhere, PEER)  # allowed: not counted

    assert probe.series(AUTH_REFUSALS.name) == {
        (("method", SUBMIT), ("reason", "wrong_role")): 2,
        (("method", SUBMIT), ("reason", "unauthenticated")): 1,
    }
    probe.close()
