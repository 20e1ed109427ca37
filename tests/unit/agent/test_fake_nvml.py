"""The fake NVML is held to the real bindings: the same names, codes, error classes and
call signatures as the installed nvidia-ml-py, and NVML's behaviour where tests lean on it
(init counting, event delivery, timeouts)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pynvml as real  # the installed nvidia-ml-py (no GPU here: only its definitions are read)
import pytest

from tests.support.nvml_fake import FakeGpus, load_fake_pynvml

FUNCTIONS = [
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetCreate",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlSystemGetDriverVersion",
]


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", devices=2)


def test_every_constant_and_error_class_matches_the_real_module(gpus: FakeGpus) -> None:
    fake = load_fake_pynvml(gpus)
    names = [n for n in dir(fake) if n.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) > 40
    for name in names:
        assert getattr(fake, name) == getattr(real, name), name
    for name in [n for n in dir(real) if n.startswith("NVMLError_")]:
        fake_class = getattr(fake, name)
        assert issubclass(fake_class, fake.NVMLError)
        code = getattr(real, name)().value
        assert fake_class().value == code
        assert type(fake.NVMLError(code)) is fake_class  # NVMLError(code) maps to its subclass
        assert str(fake.NVMLError(code)) == real.NVMLError._errcode_to_string.get(
            code, str(fake.NVMLError(code))
        )


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_has_the_real_signature(gpus: FakeGpus, name: str) -> None:
    fake = load_fake_pynvml(gpus)
    real_params = list(inspect.signature(getattr(real, name)).parameters)
    assert list(inspect.signature(getattr(fake, name)).parameters) == real_params


def test_no_state_file_is_a_host_without_the_library(tmp_path: Path) -> None:
    fake = load_fake_pynvml(tmp_path / "absent.json")
    with pytest.raises(fake.NVMLError_LibraryNotFound):
        fake.nvmlInit()


def test_calls_before_init_and_after_the_last_shutdown_are_uninitialized(gpus: FakeGpus) -> None:
    fake = load_fake_pynvml(gpus)
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 2  # reference counted, as the real library
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_readings_follow_the_state_file(gpus: FakeGpus) -> None:
    fake = load_fake_pynvml(gpus)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    gpus.set(1, gpu=0, memory=12, encoder=60, decoder=7, ecc_uncorrected_volatile=3)
    rates = fake.nvmlDeviceGetUtilizationRates(handle)
    assert (rates.gpu, rates.memory) == (0, 12)
    assert fake.nvmlDeviceGetEncoderUtilization(handle)[0] == 60
    assert fake.nvmlDeviceGetDecoderUtilization(handle)[0] == 7
    errors = fake.nvmlDeviceGetTotalEccErrors(
        handle, fake.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake.NVML_VOLATILE_ECC
    )
    assert errors == 3
    assert fake.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    gpus.set(1, lost=True)
    with pytest.raises(fake.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUtilizationRates(handle)


def test_init_fails_as_often_as_told(gpus: FakeGpus) -> None:
    gpus.init_failures(1, code=real.NVML_ERROR_UNKNOWN)
    fake = load_fake_pynvml(gpus)
    with pytest.raises(fake.NVMLError_Unknown):
        fake.nvmlInit()
    fake.nvmlInit()  # the retry succeeds
    gpus.init_failures("always", code=real.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(fake.NVMLError_DriverNotLoaded):
        fake.nvmlInit()


def test_an_xid_reaches_a_registered_set_once_and_a_wait_times_out(gpus: FakeGpus) -> None:
    fake = load_fake_pynvml(gpus)
    fake.nvmlInit()
    gpus.xid(0, 13)  # before registration: never delivered, as with the real driver
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(
        fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlEventTypeXidCriticalError, events
    )
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)
    gpus.xid(1, 43)  # a device the set does not listen to
    gpus.xid(0, 79)
    data = fake.nvmlEventSetWait(events, 0)
    assert (data.eventType, data.eventData) == (fake.nvmlEventTypeXidCriticalError, 79)
    assert data.device == fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)
