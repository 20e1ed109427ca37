"""Many rows into one table inside the caller's transaction, as fast as the store allows.

On PostgreSQL the rows go in by ``COPY ... FROM STDIN`` on the transaction's own
connection: one statement for any number of rows, each value adapted by psycopg as a bound
parameter would be. An ``executemany`` of the same rows is a statement per row on the
server (pipelined), and the fleet tick's burst writes ~30,000 of them (attempts, their job
tokens, events): COPY took a third of the time here. Elsewhere (SQLite) it is an
``executemany``. Either way nothing is committed: the caller's transaction decides.

The COPY goes around the engine's events, so it is timed here, as the operation ``COPY``
(``db.client.operation.duration``, through the engine's instruments: see
:func:`~gpufleet.common.db.operation_durations.durations_of`), from its start to the
server's answer; the ``executemany`` is timed by the engine as any statement.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, String, Table, any_, bindparam, insert
from sqlalchemy.dialects.postgresql import ARRAY

from gpufleet.common.db.operation_durations import durations_of

# The operation's name: PostgreSQL's own for the command (its command tag), known here.
COPY = "COPY"


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each with the same keys, naming columns of ``table``): a column left
    out gets its model's scalar default, and every value goes through its column type's own
    bind processing, as ``insert(table)`` would do them."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(insert(table), list(rows))
        return
    given = list(rows[0])
    unknown = [c for c in given if c not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column {', '.join(unknown)}")
    defaults: dict[str, Any] = {}
    for column in table.c:
        if column.key in given or column.default is None:
            continue
        if not getattr(column.default, "is_scalar", False):
            raise ValueError(f"{table.name}.{column.key}: only a scalar default can be filled in here")
        defaults[column.key] = getattr(column.default, "arg", None)
    columns = given + list(defaults)
    processors = [table.c[c].type.bind_processor(conn.dialect) for c in columns]
    quoted = ", ".join(conn.dialect.identifier_preparer.quote(c) for c in columns)
    raw = conn.connection.driver_connection
    assert raw is not None
    durations = durations_of(conn.engine)
    started = time.perf_counter()
    try:
        with raw.cursor() as cursor, cursor.copy(f"COPY {table.name} ({quoted}) FROM STDIN") as copy:
            for row in rows:
                values = [row[c] for c in given] + list(defaults.values())
                copy.write_row([p(v) if p else v for p, v in zip(processors, values, strict=True)])
    except Exception as err:
        durations.failed(started, COPY, err)
        raise
    durations.done(started, COPY)


def among(column: Any, values: Sequence[str], dialect: str) -> ColumnElement[bool]:
    """``column IN values`` for many string ids. On PostgreSQL it is ``column = ANY(:array)``:
    one bound array, where ``IN`` expands to a parameter per value, each compiled and sent
    apart (a burst's thousands of ids spent more time in that than in the query)."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(String)))  # type: ignore[no-any-return]
    return column.in_(list(values))  # type: ignore[no-any-return]
