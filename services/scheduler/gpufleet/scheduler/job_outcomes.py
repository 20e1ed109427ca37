"""Moved to :mod:`gpufleet.common.job_outcomes` (the ledger's machine replacements in the
reaper and the sweeper count by the same rule). Kept only for ``worker_service``, which
another change owns; import from ``gpufleet.common.job_outcomes``."""

from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally

__all__ = ["JobOutcomes", "OutcomeTally"]
