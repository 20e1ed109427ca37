"""TokenService.CheckToken through a real scheduler process on real PostgreSQL, called as
the model gateway: each refusal reason, the spend cap debited, and a token refused within
a second of its attempt ending, whichever way it ended."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import ManualClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.rich_status import details_of
from gpufleet.scheduler import tokens
from gpufleet.scheduler.token_service import TokenMinter
from gpufleet.v1 import agent_service_pb2, job_pb2, token_service_pb2, worker_service_pb2
from gpufleet.v1 import token_service_pb2_grpc as token_grpc
from gpufleet.v1 import worker_service_pb2_grpc as worker_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess

CAP = 1_000
MODEL, VOICE = token_service_pb2.TOKEN_SCOPE_MODEL, token_service_pb2.TOKEN_SCOPE_VOICE
R = token_service_pb2


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def gateway(scheduler: ServiceProcess) -> Iterator[token_grpc.TokenServiceStub]:
    with scheduler.channel("gateway") as channel:
        yield token_grpc.TokenServiceStub(channel)


def mint(
    sessions: sessionmaker[Session], machine_id: str, now: datetime, limit_s: int = 3600
) -> tuple[str, dict[str, str]]:
    attempt_id = add_attempt(sessions, now, machine_id)
    with sessions() as s:
        attempt = s.get_one(models.Attempt, attempt_id)
        job = s.get_one(models.Job, attempt.job_id)
    request = agent_service_pb2.AgentServiceStartJobRequest(
        attempt_id=attempt_id, job_id=job.id, workspace=job.workspace_id, time_limit=Duration(seconds=limit_s)
    )
    return attempt_id, TokenMinter(sessions, ManualClock(now), CAP, 60).mint(request)


def check(
    gateway: token_grpc.TokenServiceStub, token: str, scope: int = MODEL, spend: int = 0
) -> R.CheckTokenResponse:
    return gateway.CheckToken(R.CheckTokenRequest(token=token, scope=scope, spend_micros=spend), timeout=10)


def test_a_token_is_valid_names_its_attempt_and_spends_under_its_cap(
    gateway: token_grpc.TokenServiceStub, sessions: sessionmaker[Session]
) -> None:
    now = datetime.now(UTC)
    attempt_id, minted = mint(sessions, add_machine(sessions, now), now)
    first = check(gateway, minted["model"], spend=600)
    assert first.valid and first.attempt_id == attempt_id and first.scope == MODEL
    assert (first.spend_cap_micros, first.remaining_micros) == (CAP, 400)
    over = check(gateway, minted["model"], spend=401)
    assert not over.valid and over.refusal == R.TOKEN_REFUSAL_OVER_CAP and over.remaining_micros == 400
    assert not over.attempt_id, "a refusal names no attempt"
    assert check(gateway, minted["model"], spend=400).remaining_micros == 0
    assert check(gateway, minted["model"]).refusal == R.TOKEN_REFUSAL_OVER_CAP
    # Narration and model tokens are not interchangeable.
    assert check(gateway, minted["voice"], MODEL).refusal == R.TOKEN_REFUSAL_WRONG_SCOPE
    assert check(gateway, minted["model"], VOICE).refusal == R.TOKEN_REFUSAL_WRONG_SCOPE
    assert check(gateway, minted["voice"], VOICE).valid
    with sessions() as s:
        rows = (
            s.execute(select(models.JobToken).where(models.JobToken.attempt_id == attempt_id)).scalars().all()
        )
    assert {r.scope for r in rows} == {"model", "voice"}
    assert all(r.token_hash == tokens.digest(minted[r.scope]) for r in rows), "only hashes are kept"
    assert not any(minted[r.scope] in (r.token_hash, r.job_id, r.attempt_id) for r in rows)


def test_unknown_malformed_and_expired_tokens_are_refused(
    gateway: token_grpc.TokenServiceStub, sessions: sessionmaker[Session]
) -> None:
    assert check(gateway, tokens.mint(tokens.Scope.MODEL)).refusal == R.TOKEN_REFUSAL_UNKNOWN
    for junk in ("hello", "gfm_" + "A" * 36, "x" * 100_000):
        assert check(gateway, junk).refusal == R.TOKEN_REFUSAL_MALFORMED
    long_ago = datetime.now(UTC) - timedelta(hours=3)
    _, minted = mint(sessions, add_machine(sessions, long_ago), long_ago, limit_s=600)
    assert check(gateway, minted["model"]).refusal == R.TOKEN_REFUSAL_EXPIRED


@pytest.mark.parametrize(
    ("field", "request_msg"),
    [
        ("token", R.CheckTokenRequest(scope=MODEL)),
        ("scope", R.CheckTokenRequest(token="gfm_x")),
        ("spend_micros", R.CheckTokenRequest(token="gfm_x", scope=MODEL, spend_micros=-1)),
    ],
)
def test_bad_input_names_its_field(
    gateway: token_grpc.TokenServiceStub, field: str, request_msg: R.CheckTokenRequest
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        gateway.CheckToken(request_msg, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert dict(info.value.trailing_metadata() or ()).get("gpufleet-field") == field  # type: ignore[attr-defined]


def test_a_check_wrong_in_every_field_names_each_one(gateway: token_grpc.TokenServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        gateway.CheckToken(R.CheckTokenRequest(scope=99, spend_micros=-1), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert [(v.field, v.reason) for v in details_of(info.value).violations] == [
        ("token", "REQUIRED"),
        ("scope", "UNKNOWN_VALUE"),
        ("spend_micros", "OUT_OF_RANGE"),
    ]


@pytest.mark.parametrize("ending", ["SUCCEEDED", "LOST", "CANCELLED", "TIMED_OUT", "cancel_requested"])
def test_a_token_is_refused_within_a_second_of_its_attempt_ending(
    gateway: token_grpc.TokenServiceStub, sessions: sessionmaker[Session], ending: str
) -> None:
    now = datetime.now(UTC)
    attempt_id, minted = mint(sessions, add_machine(sessions, now), now)
    assert check(gateway, minted["model"]).valid
    with sessions() as s, s.begin():
        if ending == "cancel_requested":
            job_id = s.get_one(models.Attempt, attempt_id).job_id
            s.execute(update(models.Job).where(models.Job.id == job_id).values(cancel_requested=True))
        else:
            s.execute(
                update(models.Attempt)
                .where(models.Attempt.id == attempt_id)
                .values(state=ending, ended_at=now)
            )
    ended = time.monotonic()
    answer = check(gateway, minted["model"])
    assert time.monotonic() - ended < 1.0
    assert not answer.valid and answer.refusal == R.TOKEN_REFUSAL_NOT_RUNNING


def test_a_token_dies_with_its_attempts_reported_end(
    scheduler: ServiceProcess, gateway: token_grpc.TokenServiceStub, sessions: sessionmaker[Session]
) -> None:
    """The machine reports the attempt done through WorkerService; the very next check refuses."""
    now = datetime.now(UTC)
    machine_id = add_machine(sessions, now)
    attempt_id, minted = mint(sessions, machine_id, now)
    with scheduler.channel(f"machine:{machine_id}") as channel:
        worker_grpc.WorkerServiceStub(channel).ReportCompletion(
            worker_service_pb2.ReportCompletionRequest(
                machine_id=machine_id,
                attempt_id=attempt_id,
                outcome=job_pb2.ATTEMPT_STATE_SUCCEEDED,
                slot_seconds=5,
            ),
            timeout=10,
        )
    ended = time.monotonic()
    assert check(gateway, minted["voice"], VOICE).refusal == R.TOKEN_REFUSAL_NOT_RUNNING
    assert time.monotonic() - ended < 1.0
