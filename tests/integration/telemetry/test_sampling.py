"""Spans are recorded when something receives them: with no OTLP endpoint they are not
(they cost a sixth of a SubmitJob for nothing), yet every log line still carries its
trace and span ids; OTEL_TRACES_SAMPLER overrides as the OpenTelemetry SDK documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import logging
from gpufleet.common import telemetry
telemetry.configure("probe", otlp=None if ENDPOINT is None else telemetry.OtlpTarget(ENDPOINT, None))
with telemetry.tracer("probe").start_as_current_span("work") as span:
    logging.getLogger("probe").warning("inside")
    print(span.is_recording(), flush=True)
"""


def run(endpoint: str | None, env: dict[str, str]) -> tuple[bool, dict[str, object]]:
    code = PROBE.replace("ENDPOINT", repr(endpoint))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    [line] = [x for x in lines if x.get("logger") == "probe"]
    return done.stdout.strip() == "True", line


@pytest.mark.parametrize(
    ("endpoint", "env", "recorded"),
    [
        (None, {}, False),
        (None, {"OTEL_TRACES_SAMPLER": "always_on"}, True),
        # An endpoint nobody listens on: the export fails later, in the background.
        ("127.0.0.1:9", {}, True),
    ],
)
def test_spans_are_recorded_only_where_they_go_and_logs_keep_their_ids(
    endpoint: str | None, env: dict[str, str], recorded: bool
) -> None:
    was_recorded, log = run(endpoint, env)
    assert was_recorded is recorded
    assert log["message"] == "inside"
    assert len(str(log["trace_id"])) == 32 and int(str(log["trace_id"]), 16) != 0
