"""Lint, formatting and strict typing are part of the test run (configuration: the root
pyproject.toml), so a change that breaks them fails the same command that runs the tests."""

from __future__ import annotations

from tests.quality._repo import run, tool


def test_ruff_check_passes() -> None:
    result = run([tool("ruff"), "check", "--output-format", "concise", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_unchanged() -> None:
    result = run([tool("ruff"), "format", "--check", "--output-format", "concise", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes_on_protos_libs_services_and_deploy() -> None:
    result = run([tool("mypy"), "protos", "libs", "services", "deploy"], timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
