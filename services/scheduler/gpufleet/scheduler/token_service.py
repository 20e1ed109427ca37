"""TokenService (for the model gateway and the voice service) and the minting of an
attempt's tokens at its dispatch. The rules are :mod:`gpufleet.scheduler.tokens`'; this
module reads and writes their rows."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import grpc
from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db import models
from gpufleet.common.violations import Violations
from gpufleet.scheduler import tokens
from gpufleet.scheduler.tokens import Held, Refusal, Scope
from gpufleet.v1 import agent_service_pb2, token_service_pb2, token_service_pb2_grpc

log = logging.getLogger(__name__)

_SCOPES = {token_service_pb2.TOKEN_SCOPE_MODEL: Scope.MODEL, token_service_pb2.TOKEN_SCOPE_VOICE: Scope.VOICE}
_SCOPE_PB = {v: k for k, v in _SCOPES.items()}
_REFUSAL_PB = {
    Refusal.MALFORMED: token_service_pb2.TOKEN_REFUSAL_MALFORMED,
    Refusal.UNKNOWN: token_service_pb2.TOKEN_REFUSAL_UNKNOWN,
    Refusal.WRONG_SCOPE: token_service_pb2.TOKEN_REFUSAL_WRONG_SCOPE,
    Refusal.EXPIRED: token_service_pb2.TOKEN_REFUSAL_EXPIRED,
    Refusal.OVER_CAP: token_service_pb2.TOKEN_REFUSAL_OVER_CAP,
    Refusal.NOT_RUNNING: token_service_pb2.TOKEN_REFUSAL_NOT_RUNNING,
}
_WHY = {
    Refusal.MALFORMED: "not a gpufleet job token",
    Refusal.UNKNOWN: "no attempt was given this token",
    Refusal.WRONG_SCOPE: "a token of another scope",
    Refusal.EXPIRED: "the token has expired",
    Refusal.OVER_CAP: "the spend would pass the token's cap",
    Refusal.NOT_RUNNING: "its attempt no longer runs",
}
JOB_TOKENS = cast(Table, models.JobToken.__table__)
# Longest token text looked at: anything longer is refused as malformed unread.
MAX_TOKEN_CHARS = 256


@dataclass(frozen=True)
class Minted:
    """One attempt's tokens: the values that travel in its StartJob (once, never kept
    here) and the rows that hold their hashes."""

    tokens: dict[str, str]
    rows: list[dict[str, Any]]


class TokenMinter:
    """Mints an attempt's tokens (one per scope). Their hashes are committed before the
    StartJob that carries them is sent, so a token exists here before the job can ever
    present it: the assign step inserts :meth:`rows` in its own commit (no transaction per
    dispatch); a re-dispatch after a leader change commits :meth:`mint` for itself."""

    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, spend_cap_micros: int, expiry_margin_s: float
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.spend_cap_micros = spend_cap_micros
        self.margin = timedelta(seconds=expiry_margin_s)

    def rows(
        self,
        *,
        workspace: str,
        job_id: str,
        attempt_id: str,
        time_limit: timedelta,
        now: datetime,
        minted: dict[Scope, str] | None = None,
    ) -> Minted:
        """New tokens for one attempt and their rows, written by the caller's transaction.
        They expire with the attempt's time limit (a day when it has none) plus the margin.
        ``minted``: the tokens, drawn by the caller for many attempts at once (:meth:`draw`)."""
        expires = now + (time_limit if time_limit > timedelta(0) else timedelta(hours=24)) + self.margin
        if minted is None:
            minted = {scope: tokens.mint(scope) for scope in Scope}
        return Minted(
            tokens={scope.value: token for scope, token in minted.items()},
            rows=[
                {
                    "token_hash": tokens.digest(token),
                    "scope": scope.value,
                    "workspace_id": workspace,
                    "job_id": job_id,
                    "attempt_id": attempt_id,
                    "spend_cap_micros": self.spend_cap_micros,
                    "spent_micros": 0,
                    "expires_at": expires,
                    "created_at": now,
                }
                for scope, token in minted.items()
            ],
        )

    @staticmethod
    def draw(count: int) -> list[dict[Scope, str]]:
        """Tokens for ``count`` attempts, one per scope each, from one draw per scope."""
        by_scope = {scope: tokens.mint_many(scope, count) for scope in Scope}
        return [{scope: by_scope[scope][i] for scope in Scope} for i in range(count)]

    def mint(self, request: agent_service_pb2.AgentServiceStartJobRequest) -> dict[str, str]:
        """Tokens for the attempt ``request`` starts, committed in a transaction of their own."""
        return self.mint_many([request])[request.attempt_id]

    def mint_many(
        self, requests: list[agent_service_pb2.AgentServiceStartJobRequest]
    ) -> dict[str, dict[str, str]]:
        """Tokens for each request's attempt (by attempt id), committed in one transaction."""
        now = self.clock.now()
        out: dict[str, dict[str, str]] = {}
        rows: list[dict[str, Any]] = []
        for request, drawn in zip(requests, self.draw(len(requests)), strict=True):
            limit = request.time_limit.ToTimedelta() if request.HasField("time_limit") else timedelta(0)
            minted = self.rows(
                workspace=request.workspace,
                job_id=request.job_id,
                attempt_id=request.attempt_id,
                time_limit=limit,
                now=now,
                minted=drawn,
            )
            out[request.attempt_id] = minted.tokens
            rows.extend(minted.rows)
        if rows:
            with self.sessions() as session, session.begin():
                session.execute(insert(JOB_TOKENS), rows)
        return out


class TokenService(token_service_pb2_grpc.TokenServiceServicer):
    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self.sessions = sessions
        self.clock = clock

    def CheckToken(
        self, request: token_service_pb2.CheckTokenRequest, context: grpc.ServicerContext
    ) -> token_service_pb2.CheckTokenResponse:
        violations = Violations()
        if not request.token:
            violations.add("token", "is required", "REQUIRED")
        asked = _SCOPES.get(request.scope)
        if asked is None:
            violations.add("scope", "must be TOKEN_SCOPE_MODEL or TOKEN_SCOPE_VOICE", "UNKNOWN_VALUE")
        if request.spend_micros < 0:
            violations.add("spend_micros", "must not be negative", "OUT_OF_RANGE")
        violations.raise_if_any()
        assert asked is not None
        token = request.token
        if len(token) > MAX_TOKEN_CHARS or tokens.scope_of(token) is None:
            return _refused(Refusal.MALFORMED)
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            found = session.execute(
                select(models.JobToken, models.Attempt.state, models.Job.cancel_requested)
                .join(models.Attempt, models.Attempt.id == models.JobToken.attempt_id)
                .join(models.Job, models.Job.id == models.JobToken.job_id)
                .where(models.JobToken.token_hash == tokens.digest(token))
                .with_for_update(of=models.JobToken)
            ).first()
            held = None
            if found is not None:
                row, attempt_state, cancel_requested = found
                held = Held(
                    scope=Scope(row.scope),
                    spend_cap_micros=row.spend_cap_micros,
                    spent_micros=row.spent_micros,
                    expires_at=row.expires_at,
                    attempt_state=str(attempt_state),
                    cancel_requested=bool(cancel_requested),
                )
            verdict = tokens.decide(held, asked, request.spend_micros, now)
            if verdict.refusal is not None:
                # A refusal names no workspace, job or attempt.
                return _refused(verdict.refusal, verdict.remaining_micros)
            assert found is not None  # an unknown token is refused above
            if request.spend_micros:
                row.spent_micros += request.spend_micros
            return _answer(row, verdict)


def _refused(refusal: Refusal, remaining_micros: int = 0) -> token_service_pb2.CheckTokenResponse:
    return token_service_pb2.CheckTokenResponse(
        valid=False, reason=_WHY[refusal], refusal=_REFUSAL_PB[refusal], remaining_micros=remaining_micros
    )


def _answer(row: models.JobToken, verdict: tokens.Verdict) -> token_service_pb2.CheckTokenResponse:
    resp = token_service_pb2.CheckTokenResponse(
        valid=True,
        workspace=row.workspace_id,
        job_id=row.job_id,
        attempt_id=row.attempt_id,
        scope=_SCOPE_PB[Scope(row.scope)],
        spend_cap_micros=row.spend_cap_micros,
        remaining_micros=verdict.remaining_micros,
    )
    resp.expire_time.FromDatetime(row.expires_at)
    return resp
