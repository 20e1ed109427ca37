"""A careless job prints its tokens every way it can; its log, read through
JobService.GetJobLog and `gpufleet logs`, holds none of them — every process real, the
walls on, the tokens minted by the scheduler at dispatch."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import grpc
import pytest

from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.e2e.fleet import Fleet
from tests.support import tls

FORMS = ("token", "base64", "urlsafe", "hex", "url", "json", "two writes", "two lines")


def test_a_jobs_log_reaches_its_page_with_every_token_redacted(fleet: Fleet) -> None:
    fleet.start_all()
    job = fleet.submit("careless-1", duration_s=10, print_tokens="1")
    fleet.advance_until(
        lambda: fleet.get_job(job.job_id).state == job_pb2.JOB_STATE_SUCCEEDED,
        step_s=2,
        max_virtual_s=600,
        what="job succeeded",
    )
    with fleet.channel(f"127.0.0.1:{fleet.scheduler_port}", who="backend") as channel:
        stub = job_service_pb2_grpc.JobServiceStub(channel)
        whole = stub.GetJobLog(job_service_pb2.GetJobLogRequest(job_id=job.job_id), timeout=10)
        assert whole.end_of_log and whole.attempt_ended
        text = whole.data.decode()
        # Paged reads give the same bytes.
        paged, offset = b"", 0
        while True:
            part = stub.GetJobLog(
                job_service_pb2.GetJobLogRequest(job_id=job.job_id, offset=offset, max_bytes=97), timeout=10
            )
            paged += part.data
            offset = part.next_offset
            if part.end_of_log:
                break
        assert paged == whole.data
        with pytest.raises(grpc.RpcError) as info:
            stub.GetJobLog(job_service_pb2.GetJobLogRequest(job_id=job.job_id, offset=-1), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as info:
            stub.GetJobLog(job_service_pb2.GetJobLogRequest(job_id="no-such-job"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]

    for scope in ("model", "voice"):
        for form in FORMS:
            lines = [line for line in text.splitlines() if line.startswith(f"{scope} {form}:")]
            assert lines, f"the job printed no {scope} {form} line:\n{text}"
            assert all("[REDACTED]" in line for line in lines), lines
    # Nothing of either token in any encoding: no prefix raw, in hex, or percent-encoded.
    for leak in ("gfm_", "gfv_", "67666d5f", "6766765f", "%67%66%6D", "%67%66%76"):
        assert leak.lower() not in text.lower(), leak
    assert not re.search(r"gf[mv]_[A-Za-z0-9]{10,}", text)

    # The CLI shows the same page.
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "logs",
            job.job_id,
            "--scheduler",
            f"127.0.0.1:{fleet.scheduler_port}",
        ],
        env={**os.environ, **{k: v for k, v in tls.env("operator").items() if k.startswith("GPUFLEET_TLS_")}},
        capture_output=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == whole.data
