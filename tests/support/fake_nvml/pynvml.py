"""A faithful stand-in for nvidia-ml-py's ``pynvml`` module, for machines with no GPU.

Put this folder first on a process's ``PYTHONPATH`` (or on ``sys.path``) and ``import
pynvml`` finds it instead of the real bindings, so a real agent process can be driven
from outside: the test writes the GPUs' state as JSON to the file named by
``GPUFLEET_FAKE_NVML_STATE`` and every call reads it afresh. No file (or no variable)
behaves like a host without the driver library: ``nvmlInit`` raises
``NVMLError_LibraryNotFound``, as the real module does.

Same names, call signatures, return shapes and error classes as nvidia-ml-py 13.x (the
version pinned here): every failure is ``NVMLError(code)``, which maps to the
``NVMLError_<Name>`` subclass of that code; calls before ``nvmlInit`` raise
``NVMLError_Uninitialized``; init and shutdown are reference counted;
``nvmlEventSetWait`` blocks (in real time, up to ``timeoutms``) and raises
``NVMLError_Timeout`` when nothing arrived; an event is delivered only to a set that was
registered for its device and type before it happened, and only once per set.

The state file::

    {
      "devices": [
        {"gpu": 0, "memory": 0, "encoder": 0, "decoder": 0,
         "ecc_uncorrected_volatile": 0, "ecc_corrected_volatile": 0,
         "retired_pages_pending": false,
         "remapped_rows": {"correctable": 0, "uncorrectable": 0,
                           "pending": false, "failure": false},
         "lost": false}
      ],
      "xid_events": [{"device": 0, "xid": 79}],
      "init_failures": 0,
      "init_error": 999
    }

``xid_events`` only grows (append to inject); ``init_failures`` is how many of this
process's first ``nvmlInit`` calls fail (``"always"``: every one) with ``init_error``
(default ``NVML_ERROR_UNKNOWN``); ``lost`` makes every call on that device raise
``NVMLError_GpuIsLost`` (the GPU fell off the bus).
"""

from __future__ import annotations

import json
import os
import string
import sys
import threading
import time
from typing import Any, NoReturn

# Return codes, as in nvml.h / pynvml.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypeNone = 0x0000000000000000

STATE_ENV = "GPUFLEET_FAKE_NVML_STATE"
# Real seconds between two reads of the state file while an event wait blocks.
_WAIT_POLL_S = 0.02


class NVMLError(Exception):
    """As pynvml's: ``NVMLError(code)`` builds the subclass of that code."""

    _valClassMapping: dict[int, type] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    value: int

    def __new__(typ, value: int) -> NVMLError:
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def nvmlExceptionClass(nvmlErrorCode: int) -> type:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


def _extractNVMLErrorsAsClasses() -> None:
    """NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, exactly as pynvml names them."""
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val: int) -> Any:
            def new(typ: type, *args: object) -> NVMLError:
                return NVMLError.__new__(typ, val)  # type: ignore[arg-type]

            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


def _raise(code: int) -> NoReturn:
    raise NVMLError(code)


class _Process:
    """What one process's library holds: its init count and event sets."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.init_count = 0
        self.init_calls = 0
        self.state_path = ""


_PROCESS = _Process()


def fake_use_state_file(path: str) -> None:
    """Test-only (not in pynvml): read this file instead of ``$GPUFLEET_FAKE_NVML_STATE``,
    for a copy of the module loaded inside a test process."""
    _PROCESS.state_path = path


def _state() -> dict[str, Any]:
    path = _PROCESS.state_path or os.environ.get(STATE_ENV, "")
    if not path:
        _raise(NVML_ERROR_LIBRARY_NOT_FOUND)
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        _raise(NVML_ERROR_LIBRARY_NOT_FOUND)
    except ValueError:
        # Read while the test rewrote it without a rename: the driver "hiccups".
        _raise(NVML_ERROR_UNKNOWN)
    return doc if isinstance(doc, dict) else {}


def _require_init() -> dict[str, Any]:
    if _PROCESS.init_count <= 0:
        _raise(NVML_ERROR_UNINITIALIZED)
    return _state()


class c_nvmlDevice_t:
    """A device handle (pynvml's is a ctypes pointer; only identity and index matter)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, c_nvmlDevice_t) and other.index == self.index

    def __hash__(self) -> int:
        return hash(self.index)

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def _device(handle: Any) -> dict[str, Any]:
    state = _require_init()
    if not isinstance(handle, c_nvmlDevice_t):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    devices = state.get("devices", [])
    if not 0 <= handle.index < len(devices):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    device = devices[handle.index]
    if device.get("lost"):
        _raise(NVML_ERROR_GPU_IS_LOST)
    return dict(device)


def nvmlInitWithFlags(flags: int) -> None:
    with _PROCESS.lock:
        _PROCESS.init_calls += 1
        state = _state()
        failures = state.get("init_failures", 0)
        if failures == "always" or (isinstance(failures, int) and _PROCESS.init_calls <= failures):
            _raise(int(state.get("init_error", NVML_ERROR_UNKNOWN)))
        _PROCESS.init_count += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    with _PROCESS.lock:
        if _PROCESS.init_count <= 0:
            _raise(NVML_ERROR_UNINITIALIZED)
        _PROCESS.init_count -= 1


def nvmlDeviceGetCount() -> int:
    return len(_require_init().get("devices", []))


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    devices = _require_init().get("devices", [])
    if not 0 <= index < len(devices):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if devices[index].get("lost"):
        _raise(NVML_ERROR_GPU_IS_LOST)
    return c_nvmlDevice_t(index)


class c_nvmlUtilization_t:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
    device = _device(handle)
    return c_nvmlUtilization_t(int(device.get("gpu", 0)), int(device.get("memory", 0)))


def nvmlDeviceGetEncoderUtilization(handle: c_nvmlDevice_t) -> list[int]:
    """``[utilisation %, sampling period µs]``, as pynvml returns it."""
    return [int(_device(handle).get("encoder", 0)), 167000]


def nvmlDeviceGetDecoderUtilization(handle: c_nvmlDevice_t) -> list[int]:
    return [int(_device(handle).get("decoder", 0)), 167000]


def nvmlDeviceGetTotalEccErrors(handle: c_nvmlDevice_t, errorType: int, counterType: int) -> int:
    device = _device(handle)
    if device.get("ecc_supported") is False:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    which = "uncorrected" if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
    scope = "volatile" if counterType == NVML_VOLATILE_ECC else "aggregate"
    volatile = int(device.get(f"ecc_{which}_volatile", 0))
    # The aggregate counter survives reboots: never below the volatile one.
    return max(volatile, int(device.get(f"ecc_{which}_aggregate", 0))) if scope == "aggregate" else volatile


def nvmlDeviceGetRetiredPagesPendingStatus(device: c_nvmlDevice_t) -> int:
    gpu = _device(device)
    if gpu.get("page_retirement_supported") is False:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if gpu.get("retired_pages_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(device: c_nvmlDevice_t) -> tuple[int, int, int, int]:
    """``(correctable, uncorrectable, pending, failure)``, as pynvml returns it."""
    gpu = _device(device)
    rows = gpu.get("remapped_rows")
    if rows is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)  # pre-Ampere GPUs retire pages instead
    return (
        int(rows.get("correctable", 0)),
        int(rows.get("uncorrectable", 0)),
        int(bool(rows.get("pending", False))),
        int(bool(rows.get("failure", False))),
    )


def nvmlDeviceGetSupportedEventTypes(handle: c_nvmlDevice_t) -> int:
    _device(handle)
    return (
        nvmlEventTypeSingleBitEccError
        | nvmlEventTypeDoubleBitEccError
        | nvmlEventTypePState
        | nvmlEventTypeXidCriticalError
        | nvmlEventTypeClock
    )


class c_nvmlEventData_t:
    def __init__(self, device: c_nvmlDevice_t, eventType: int, eventData: int) -> None:
        self.device = device
        self.eventType = eventType
        self.eventData = eventData
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class c_nvmlEventSet_t:
    """An event set: which devices and types it listens to, and what it has delivered."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        # Index into the state's xid_events: what happened before registration is never
        # delivered, and each event once.
        self.next_event = 0
        self.freed = False


def nvmlEventSetCreate() -> c_nvmlEventSet_t:
    _require_init()
    return c_nvmlEventSet_t()


def nvmlDeviceRegisterEvents(handle: c_nvmlDevice_t, eventTypes: int, eventSet: c_nvmlEventSet_t) -> None:
    state = _require_init()
    _device(handle)
    if not isinstance(eventSet, c_nvmlEventSet_t) or eventSet.freed:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if eventTypes & ~nvmlDeviceGetSupportedEventTypes(handle):
        _raise(NVML_ERROR_NOT_SUPPORTED)
    if not eventSet.masks:
        eventSet.next_event = len(state.get("xid_events", []))
    eventSet.masks[handle.index] = eventSet.masks.get(handle.index, 0) | eventTypes


def nvmlEventSetWait_v2(eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
    """The next event for the set, waiting up to ``timeoutms``; NVMLError_Timeout if none."""
    deadline = time.monotonic() + max(0, timeoutms) / 1000.0
    while True:
        state = _require_init()
        if not isinstance(eventSet, c_nvmlEventSet_t) or eventSet.freed:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        events = state.get("xid_events", [])
        while eventSet.next_event < len(events):
            event = events[eventSet.next_event]
            eventSet.next_event += 1
            index = int(event.get("device", 0))
            if eventSet.masks.get(index, 0) & nvmlEventTypeXidCriticalError:
                xid = int(event["xid"])
                return c_nvmlEventData_t(c_nvmlDevice_t(index), nvmlEventTypeXidCriticalError, xid)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _raise(NVML_ERROR_TIMEOUT)
        time.sleep(min(_WAIT_POLL_S, remaining))


def nvmlEventSetWait(eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: c_nvmlEventSet_t) -> None:
    _require_init()
    eventSet.freed = True


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle).get("name", "NVIDIA L4"))


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    return str(_device(handle).get("uuid", f"GPU-00000000-0000-0000-0000-{handle.index:012d}"))


def nvmlSystemGetDriverVersion() -> str:
    _require_init()
    return "550.54.15"
