"""The contracts (DESIGN.md §8): the committed generated code matches the .proto files, and the
.proto files pass buf's STANDARD lint. Each gate is also shown to fail on a broken copy."""

from __future__ import annotations

from pathlib import Path

from tests.quality._repo import REPO, copy_tree, run, tool

# Valid proto3 that changes the generated code of machine.proto but breaks no lint rule.
NEW_ENUM = """
enum DriftProbe {
  DRIFT_PROBE_UNSPECIFIED = 0;
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
