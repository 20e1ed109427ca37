"""Driving the fake NVML (tests/support/fake_nvml/pynvml.py) from a test.

:class:`FakeGpus` writes the state file the fake reads on every call (atomically: a reader
never sees half a file); :func:`load_fake_pynvml` gives a test its own copy of the module
(its own init count and event sets, as a separate process would have);
:func:`agent_env` puts the fake first on a child process's ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

FAKE_NVML_DIR = Path(__file__).resolve().parent / "fake_nvml"
STATE_ENV = "GPUFLEET_FAKE_NVML_STATE"
_copies = itertools.count()


def idle_device() -> dict[str, Any]:
    return {
        "gpu": 0,
        "memory": 0,
        "encoder": 0,
        "decoder": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_corrected_volatile": 0,
        "retired_pages_pending": False,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "lost": False,
    }


class FakeGpus:
    """The GPUs of one fake machine, as a state file."""

    def __init__(self, path: Path, devices: int = 1) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "devices": [idle_device() for _ in range(devices)],
            "xid_events": [],
            "init_failures": 0,
        }
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.doc), encoding="utf-8")
        os.replace(tmp, self.path)

    def set(self, device: int, **fields: Any) -> None:
        self.doc["devices"][device].update(fields)
        self.write()

    def xid(self, device: int, xid: int) -> None:
        self.doc["xid_events"].append({"device": device, "xid": xid})
        self.write()

    def init_failures(self, count: int | str, code: int = 999) -> None:
        self.doc["init_failures"] = count
        self.doc["init_error"] = code
        self.write()


def load_fake_pynvml(state: Path | FakeGpus) -> ModuleType:
    """A fresh copy of the fake module reading ``state``."""
    name = f"fake_pynvml_{next(_copies)}"
    spec = importlib.util.spec_from_file_location(name, FAKE_NVML_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the module names its error classes through sys.modules
    spec.loader.exec_module(module)
    module.fake_use_state_file(str(state.path if isinstance(state, FakeGpus) else state))
    return module


def inherited_pythonpath() -> dict[str, str]:
    """This process's PYTHONPATH, if any: what :func:`agent_env` puts the fake in front of."""
    return {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}


def agent_env(env: dict[str, str], state: FakeGpus) -> dict[str, str]:
    """``env`` for a process whose ``import pynvml`` finds the fake, reading ``state``."""
    path = os.pathsep.join(p for p in (str(FAKE_NVML_DIR), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, STATE_ENV: str(state.path)}
