"""Counting what a transaction wrote only once it is true: when the transaction commits.

Some writers do not own the transaction they write in — the ledger's rows and the outcomes
it applies run inside a net's fenced pass, a job completion, a sweeper's loss — so they
cannot count after a commit they never see. They hand their count to :func:`when_committed`
instead: it is kept in ``session.info`` with the transaction it was noted in, run when the
outermost transaction commits, dropped when that transaction or a savepoint around the
note rolls back, and dropped when the outermost transaction ends any other way (a session
closed without committing). A count for a write that was rolled back (a fenced leader's
pass, a failed commit) would count something that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

__all__ = ["when_committed"]

_log = logging.getLogger(__name__)
_PENDING = "gpufleet.db.when_committed"


@dataclass(frozen=True)
class _Pending:
    count: Callable[[], None]
    transaction: SessionTransaction | None


def when_committed(session: Session, count: Callable[[], None]) -> None:
    """Run ``count`` once the transaction ``session`` is in now commits, never otherwise.

    ``count`` records a metric: it runs after the commit, so it must not touch the session,
    and whatever it raises is logged and dropped (a metric never fails the work it measures)."""
    pending: list[_Pending] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        event.listen(session, "after_commit", _committed)
        event.listen(session, "after_soft_rollback", _rolled_back)
        event.listen(session, "after_transaction_end", _ended)
    transaction = session.get_nested_transaction() or session.get_transaction()
    pending.append(_Pending(count, transaction))


def _committed(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint released: what it wrote commits (or not) with the transaction around it
    pending: list[_Pending] = session.info.get(_PENDING, [])
    counts, pending[:] = list(pending), []
    for noted in counts:
        try:
            noted.count()
        except Exception:
            _log.exception("could not count a committed write")


def _rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    pending: list[_Pending] = session.info.get(_PENDING, [])
    pending[:] = [noted for noted in pending if not _within(noted.transaction, previous_transaction)]


def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        session.info.get(_PENDING, []).clear()


def _within(inner: SessionTransaction | None, outer: SessionTransaction) -> bool:
    while inner is not None:
        if inner is outer:
            return True
        inner = inner.parent
    return False
