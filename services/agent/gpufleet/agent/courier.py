"""The worker's side of checkpoints: it reads the checkpoint an attempt starts from before
its runner is started, and sends each running attempt's newest packed checkpoint to the
control plane, a bounded number of bytes a tick so that a heartbeat is never held up
(see :mod:`gpufleet.agent.checkpoints` for the folder and the packing).

A send survives the worker's restart: how far it got is kept beside the archive, and a
part the scheduler already holds is accepted again. A checkpoint the scheduler refuses
for good (the attempt ended, the kind keeps none) is dropped; one it could not be reached
for waits for the next tick.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from gpufleet.agent import checkpoints
from gpufleet.agent.reporter import ReportRefused, SchedulerReports
from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import AttemptFiles
from gpufleet.common.errors import GpufleetError

log = logging.getLogger(__name__)


class CheckpointCourier:
    def __init__(self, reports: SchedulerReports, *, send_per_tick_bytes: int, tries: int = 3) -> None:
        self.reports = reports
        self.send_per_tick_bytes = send_per_tick_bytes
        self.tries = tries

    def fetch(self, spec: JobSpec, dest: Path) -> bool:
        """The checkpoint ``spec`` starts from, into ``dest``, checked against its size and
        SHA-256; False (and nothing at ``dest``) when it could not be read: the job then
        starts from the beginning, which is slower but never wrong."""
        for attempt in range(1, self.tries + 1):
            try:
                self._fetch_once(spec, dest)
                log.info(
                    "attempt %s: checkpoint %s read (%d bytes)",
                    spec.attempt_id,
                    spec.checkpoint_id,
                    spec.checkpoint_size_bytes,
                )
                return True
            except (GpufleetError, ReportRefused, ValueError) as err:
                dest.unlink(missing_ok=True)
                final = isinstance(err, ReportRefused | ValueError) or attempt == self.tries
                log.warning(
                    "attempt %s: checkpoint %s not read (%s)%s",
                    spec.attempt_id,
                    spec.checkpoint_id,
                    err,
                    "; the job starts from the beginning" if final else "; trying again",
                )
                if final:
                    return False
        return False

    def _fetch_once(self, spec: JobSpec, dest: Path) -> None:
        digest = hashlib.sha256()
        got = 0
        with dest.open("wb") as out:
            while True:
                data, eof = self.reports.read_checkpoint(spec.attempt_id, spec.checkpoint_id, got)
                out.write(data)
                digest.update(data)
                got += len(data)
                if got > spec.checkpoint_size_bytes:
                    raise ValueError(f"more than the {spec.checkpoint_size_bytes} bytes announced")
                if eof or not data:
                    break
            out.flush()
            os.fsync(out.fileno())
        if got != spec.checkpoint_size_bytes or digest.hexdigest() != spec.checkpoint_sha256:
            raise ValueError("its size or SHA-256 is not the one announced")

    def send(self, running: Iterable[AttemptFiles]) -> None:
        """Send what fits this tick of each running attempt's newest checkpoint."""
        budget = self.send_per_tick_bytes
        for files in running:
            if budget <= 0:
                return
            out = checkpoints.newest_outgoing(files)
            if out is None:
                continue
            try:
                budget -= self._send(files.attempt_id, out, budget)
            except ReportRefused as err:
                log.warning("attempt %s: checkpoint refused for good (%s); dropped", files.attempt_id, err)
                checkpoints.drop(out)
            except GpufleetError as err:
                log.warning("attempt %s: checkpoint not sent yet (%s)", files.attempt_id, err)
                return

    def _send(self, attempt_id: str, out: checkpoints.Outgoing, budget: int) -> int:
        spent = 0
        while out.sent < out.size and spent < budget:
            data = checkpoints.read_part(out)
            out.sent = self.reports.put_checkpoint_part(attempt_id, out.upload_id, out.sent, data)
            spent += len(data)
            checkpoints.record_progress(out)
        if out.sent >= out.size:
            sequence = self.reports.commit_checkpoint(attempt_id, out.upload_id, out.size, out.sha256)
            checkpoints.drop(out)
            log.info("attempt %s: checkpoint %d kept by the control plane", attempt_id, sequence)
        return spent
