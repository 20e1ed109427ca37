"""The scheduler's request-level watchdogs (DESIGN §4, seed 000's last rows).

Each is one module: a scan (one query), a pure ``decide(now, rows, policy)`` that returns
what to do and what to refuse by gate, and a thin apply that re-checks each row in a
fenced transaction (compare-and-set on what the scan saw) and appends its ledger row. Each
runs as its own task of the scheduler's Ticker, so it has its own cadence, span
(``scheduler.<name>.tick``) and counters in ``gpufleet watchdogs``.
"""
