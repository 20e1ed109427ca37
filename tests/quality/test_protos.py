"""The contracts (DESIGN.md §8): the committed generated code matches the .proto files, and the
.proto files pass buf's STANDARD and COMMENTS lint (every service, method, message, field,
enum and enum value commented). Each gate is also shown to fail on a broken copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.quality._repo import REPO, copy_tree, run, tool

# Valid proto3 that changes the generated code of machine.proto but breaks no lint rule.
NEW_ENUM = """
// A probe of the drift check.
enum DriftProbe {
  // Not set.
  DRIFT_PROBE_UNSPECIFIED = 0;
  // Changed.
  DRIFT_PROBE_CHANGED = 1;
}
"""
# An enum without a zero ..._UNSPECIFIED value and without its name as prefix.
LINT_VIOLATION = """
enum Colour {
  RED = 0;
  GREEN = 1;
}
"""


def genproto_check(protos: Path | None = None) -> tuple[int, str]:
    argv = [str(REPO / "scripts" / "genproto"), "--check"]
    if protos is not None:
        argv.append(str(protos))
    result = run(argv)
    return result.returncode, result.stdout + result.stderr


def buf_lint(protos: Path) -> tuple[int, str]:
    result = run([tool("buf"), "lint"], cwd=protos)
    return result.returncode, result.stdout + result.stderr


def test_committed_generated_code_matches_the_protos() -> None:
    code, output = genproto_check()
    assert code == 0, output


def test_the_drift_check_passes_an_unchanged_copy(tmp_path: Path) -> None:
    copy_tree(tmp_path, "protos")
    code, output = genproto_check(tmp_path / "protos")
    assert code == 0, output


def test_the_drift_check_fails_when_a_proto_changes_without_regenerating(tmp_path: Path) -> None:
    copy_tree(tmp_path, "protos")
    proto = tmp_path / "protos" / "gpufleet" / "v1" / "machine.proto"
    proto.write_text(proto.read_text() + NEW_ENUM)

    code, output = genproto_check(tmp_path / "protos")

    assert code != 0, output
    assert "gpufleet/v1/machine_pb2.py is out of date" in output
    assert "job_pb2.py" not in output  # only what changed is reported


def test_the_drift_check_fails_on_a_generated_file_without_a_proto(tmp_path: Path) -> None:
    copy_tree(tmp_path, "protos")
    # A .proto that nothing imports is deleted, its generated files are left behind.
    (tmp_path / "protos" / "gpufleet" / "v1" / "token_service.proto").unlink()

    code, output = genproto_check(tmp_path / "protos")

    assert code != 0, output
    assert "stale" in output and "token_service_pb2.py" in output


def test_protos_pass_buf_lint() -> None:
    code, output = buf_lint(REPO / "protos")
    assert code == 0, output


def test_buf_lint_fails_on_an_enum_without_an_unspecified_zero_value(tmp_path: Path) -> None:
    copy_tree(tmp_path, "protos")
    proto = tmp_path / "protos" / "gpufleet" / "v1" / "machine.proto"
    proto.write_text(proto.read_text() + LINT_VIOLATION)

    code, output = buf_lint(tmp_path / "protos")

    assert code != 0, output
    assert "gpufleet/v1/machine.proto" in output
    assert "RED" in output


@pytest.mark.parametrize(
    ("proto", "anchor", "addition", "complaint"),
    [
        # A field with no comment in a commented message.
        (
            "job.proto",
            "  repeated Attempt attempts = 20;\n",
            "  string uncommented_probe = 99;\n",
            'Field "uncommented_probe" should have a non-empty comment',
        ),
        # A method with no comment in a commented service.
        (
            "job_service.proto",
            "  rpc GetJob(GetJobRequest) returns (Job);\n",
            "  rpc GetJobAgain(GetJobRequest) returns (Job);\n",
            'RPC "GetJobAgain" should have a non-empty comment',
        ),
        # An enum value with no comment.
        (
            "machine.proto",
            "  MACHINE_STATE_DESTROYED = 10;\n",
            "  MACHINE_STATE_UNCOMMENTED_PROBE = 11;\n",
            'Enum value "MACHINE_STATE_UNCOMMENTED_PROBE" should have a non-empty comment',
        ),
        # A message with no comment at all.
        ("catalog.proto", "", "\nmessage UncommentedProbe {}\n", 'Message "UncommentedProbe" should have'),
    ],
    ids=["field", "method", "enum value", "message"],
)
def test_buf_lint_fails_on_an_uncommented_element(
    tmp_path: Path, proto: str, anchor: str, addition: str, complaint: str
) -> None:
    copy_tree(tmp_path, "protos")
    path = tmp_path / "protos" / "gpufleet" / "v1" / proto
    text = path.read_text()
    if anchor:
        assert anchor in text
        text = text.replace(anchor, anchor + addition, 1)
    else:
        text += addition
    path.write_text(text)

    code, output = buf_lint(tmp_path / "protos")

    assert code != 0, output
    assert f"gpufleet/v1/{proto}" in output
    assert complaint in output
