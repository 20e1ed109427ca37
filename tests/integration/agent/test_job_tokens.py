"""A job's tokens reach it as files in its own folder — never in its argv or environment —
on a real agent (walls off here: the walls' own test proves another slot cannot read a
job's folder)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from gpufleet.common.errors import InvalidArgument
from tests.integration.agent.conftest import AgentLauncher, start_request
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

REPORTING_JOB = """
import hashlib, json, os, stat, sys
spec = json.load(open(os.environ["GPUFLEET_JOB_SPEC"]))
folder = os.environ.get("GPUFLEET_TOKENS_DIR", "")
report = {"folder": folder, "files": {}, "env": dict(os.environ), "argv": sys.argv}
for name in sorted(os.listdir(folder)) if folder else []:
    path = os.path.join(folder, name)
    report["files"][name] = {
        "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
        "mode": oct(stat.S_IMODE(os.stat(path).st_mode)),
    }
report["folder_mode"] = oct(stat.S_IMODE(os.stat(folder).st_mode)) if folder else ""
with open(spec["tenant_values"]["report"], "w") as fh:
    json.dump(report, fh)
"""

MODEL = "gfm_" + "A" * 36
VOICE = "gfv_" + "b" * 36


def test_tokens_are_files_in_the_jobs_folder_and_nowhere_else(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    script = tmp_path / "reporting_job.py"
    script.write_text(REPORTING_JOB)
    (tmp_path / "m").mkdir()
    agent = launcher.start(
        tmp_path / "m" / "state",
        machine_id="tok-1",
        extra_env={
            "GPUFLEET_PIPELINE_COMMAND": json.dumps([sys.executable, str(script)]),
            "GPUFLEET_WALLS": "off",
        },
    )
    report_path = tmp_path / "report.json"
    request = start_request("tok-job", slot=0, duration_s=1)
    request.tenant_values["report"] = str(report_path)
    request.tokens["model"] = MODEL
    request.tokens["voice"] = VOICE
    with agent.client() as client:
        client.start_job(request)
    wait_for(lambda: fake_scheduler.completion("tok-job"), what="completion")
    report = json.loads(report_path.read_text())
    assert report["folder"].endswith("/tokens")
    assert report["folder_mode"] == "0o700"
    assert report["files"] == {
        "model": {"sha256": hashlib.sha256(MODEL.encode()).hexdigest(), "mode": "0o400"},
        "voice": {"sha256": hashlib.sha256(VOICE.encode()).hexdigest(), "mode": "0o400"},
    }
    seen = json.dumps(report["env"]) + json.dumps(report["argv"])
    assert MODEL not in seen and VOICE not in seen


@pytest.mark.parametrize(
    ("tokens", "complaint"),
    [({"billing": "gfm_" + "A" * 36}, "unknown scope"), ({"model": "x; rm -rf /"}, "not a token")],
)
def test_a_bad_token_is_refused_naming_the_field(
    launcher: AgentLauncher, tmp_path: Path, tokens: dict[str, str], complaint: str
) -> None:
    (tmp_path / "m").mkdir()
    agent = launcher.start(tmp_path / "m" / "state", machine_id="tok-2", extra_env={"GPUFLEET_WALLS": "off"})
    request = start_request("tok-bad", slot=0)
    request.tokens.update(tokens)
    with agent.client() as client, pytest.raises(InvalidArgument) as caught:
        client.start_job(request)
    assert caught.value.field == "tokens" and complaint in caught.value.message
