"""GPU health on the agent: what NVML says is wrong with this machine's GPUs.

A GPU can fail while the machine looks fine — it still boots, the agent still answers,
the worker still heartbeats — and every job given to it fails as if it were the tenant's
own. The watcher reads what NVML offers about the GPUs' health and keeps one report:

- **Xid events**, waited for on an NVML event set (``nvmlDeviceRegisterEvents`` with
  ``nvmlEventTypeXidCriticalError``, ``nvmlEventSetWait``); the event's data is the Xid;
- **volatile ECC counts** (since the driver loaded), polled: uncorrectable and correctable;
- **retired pages pending** (pre-Ampere) and **remapped rows** pending / failed (Ampere and
  later, the L4 included), polled;
- **a GPU lost** (``NVMLError_GpuIsLost`` on any read);
- **initialisation** at start: NVML init and a handle per GPU, retried once before it is
  reported (on one cloud about 0.1 % of L4 starts fail CUDA/NVML initialisation and a
  retry succeeds).

Severity is decided in one place, :func:`classify` over :data:`CRITICAL_XIDS` and the
policy: *critical* means the GPU cannot be trusted with work (the control plane cordons
the machine, ends its attempts as the platform's failure and replaces it); *warning* is
counted and logged. The critical Xids follow NVIDIA's Xid catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html — the codes whose
resolution is a GPU reset, a node reboot or contacting support, as opposed to
RESTART_APP): 48 double-bit ECC, 61/62 internal micro-controller halt, 63/64 ECC page
retirement or row remapping event/failure, 74 NVLink error, 79 GPU fallen off the bus, 92
high single-bit ECC rate, 94/95 contained/uncontained ECC error, 119/120 GSP RPC timeout /
GSP error, 140 unrecovered ECC. Every other Xid — 13 graphics engine exception, 31 GPU
memory page fault, 43 GPU stopped processing, usually the application's own fault — is a
warning.

Findings are kept until the agent's state folder is wiped (a new machine): an Xid is an
event, seen once, and a restarted agent must still report it. The report is written to
``gpu_health.json`` in the state folder, where the worker reads it for its heartbeat.
Another process of the machine may add a finding to it (a slot's runner whose GPUs do not
initialise: :func:`record_finding`); the watcher adopts what it finds there each time it
writes, so Probe answers it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.agent.statedir import atomic_write_text
from gpufleet.common.clock import Clock
from gpufleet.v1 import machine_pb2

log = logging.getLogger(__name__)

HEALTH_FILE = "gpu_health.json"

# NVIDIA's Xid catalogue: resolution RESET_GPU / RESTART_BM / CONTACT_SUPPORT (see above).
CRITICAL_XIDS: frozenset[int] = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# At most this many findings are kept and reported (the heartbeat's bound).
MAX_FINDINGS = 32


class Severity(StrEnum):
    WARNING = "warning"
    CRITICAL = "critical"


class HealthState(StrEnum):
    UNMONITORED = "unmonitored"  # no NVML here: no GPU, or a development machine
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"


class Kind(StrEnum):
    XID = "xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ECC_CORRECTABLE = "ecc_correctable"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    GPU_LOST = "gpu_lost"
    INIT_FAILED = "init_failed"


@dataclass(frozen=True)
class HealthPolicy:
    """The thresholds (agent settings ``GPUFLEET_GPU_*``)."""

    critical_xids: frozenset[int] = CRITICAL_XIDS
    # Volatile uncorrectable ECC errors (since the driver loaded) at which the GPU is critical.
    ecc_uncorrectable_critical: int = 1
    # Volatile correctable ECC errors at which a warning is raised.
    ecc_correctable_warning: int = 100


def classify(kind: Kind, code: int, policy: HealthPolicy) -> Severity | None:
    """The severity table: one place, every kind. None: nothing to report (under a threshold)."""
    match kind:
        case Kind.XID:
            return Severity.CRITICAL if code in policy.critical_xids else Severity.WARNING
        case Kind.ECC_UNCORRECTABLE:
            return Severity.CRITICAL if code >= policy.ecc_uncorrectable_critical else None
        case Kind.ECC_CORRECTABLE:
            return Severity.WARNING if code >= policy.ecc_correctable_warning else None
        case Kind.ROW_REMAP_FAILURE | Kind.GPU_LOST | Kind.INIT_FAILED:
            return Severity.CRITICAL
        case Kind.RETIRED_PAGES_PENDING | Kind.ROW_REMAP_PENDING:
            # The memory is already protected; a GPU reset completes it. Seen, not acted on.
            return Severity.WARNING


@dataclass(frozen=True)
class Finding:
    kind: Kind
    severity: Severity
    gpu_index: int  # -1: the machine as a whole
    code: int
    message: str
    first_seen: datetime
    count: int = 1

    @property
    def key(self) -> tuple[str, int, int]:
        # ECC counts are one finding per GPU whatever the count; an Xid one per number.
        return (self.kind.value, self.gpu_index, self.code if self.kind == Kind.XID else 0)


@dataclass(frozen=True)
class HealthReport:
    state: HealthState
    findings: tuple[Finding, ...] = ()
    read_at: datetime | None = None

    def critical(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.CRITICAL]


def state_of(findings: Iterable[Finding]) -> HealthState:
    severities = {f.severity for f in findings}
    if Severity.CRITICAL in severities:
        return HealthState.CRITICAL
    if Severity.WARNING in severities:
        return HealthState.WARNING
    return HealthState.OK


def health_file(state_root: Path) -> Path:
    return state_root / HEALTH_FILE


def save_report(path: Path, report: HealthReport) -> None:
    doc = {
        "state": report.state.value,
        "read_at": report.read_at.isoformat() if report.read_at else None,
        "findings": [
            {
                **asdict(f),
                "kind": f.kind.value,
                "severity": f.severity.value,
                "first_seen": f.first_seen.isoformat(),
            }
            for f in report.findings
        ],
    }
    atomic_write_text(path, json.dumps(doc, sort_keys=True))


def load_report(path: Path) -> HealthReport | None:
    """The report last written, or None (never written, or unreadable: not reported)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        findings = tuple(
            Finding(
                kind=Kind(f["kind"]),
                severity=Severity(f["severity"]),
                gpu_index=int(f["gpu_index"]),
                code=int(f["code"]),
                message=str(f["message"]),
                first_seen=datetime.fromisoformat(f["first_seen"]),
                count=int(f["count"]),
            )
            for f in doc["findings"]
        )
        read_at = datetime.fromisoformat(doc["read_at"]) if doc.get("read_at") else None
        return HealthReport(HealthState(doc["state"]), findings, read_at)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("GPU health file %s unreadable (%s); not reported", path, err)
        return None


@contextlib.contextmanager
def report_lock(path: Path) -> Iterator[None]:
    """One writer of the report at a time (the watcher, a runner recording a finding), so
    that neither writes over what the other just added."""
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_finding(
    path: Path, kind: Kind, gpu_index: int, code: int, message: str, at: datetime, policy: HealthPolicy
) -> Finding | None:
    """Add one finding to the report on disk from outside the watcher (a slot's runner is
    a process of its own): the worker's next heartbeat carries it, and the watcher adopts
    it the next time it writes. A finding already there counts once more."""
    severity = classify(kind, code, policy)
    if severity is None:
        return None
    finding = Finding(kind, severity, gpu_index, code, message, at)
    with report_lock(path):
        previous = load_report(path)
        findings = {f.key: f for f in (previous.findings if previous else ())}
        seen = findings.get(finding.key)
        if seen is not None:
            finding = replace(seen, count=seen.count + 1)
        elif len(findings) >= MAX_FINDINGS:
            return None
        findings[finding.key] = finding
        ordered = tuple(sorted(findings.values(), key=_worst_first))
        save_report(path, HealthReport(state_of(ordered), ordered, previous.read_at if previous else None))
    logger = log.error if severity == Severity.CRITICAL else log.warning
    logger("GPU health %s: %s", severity.value, message)
    return finding


_STATE_TO_PROTO = {
    HealthState.UNMONITORED: machine_pb2.GPU_HEALTH_STATE_UNMONITORED,
    HealthState.OK: machine_pb2.GPU_HEALTH_STATE_OK,
    HealthState.WARNING: machine_pb2.GPU_HEALTH_STATE_WARNING,
    HealthState.CRITICAL: machine_pb2.GPU_HEALTH_STATE_CRITICAL,
}
_SEVERITY_TO_PROTO = {
    Severity.WARNING: machine_pb2.GPU_FINDING_SEVERITY_WARNING,
    Severity.CRITICAL: machine_pb2.GPU_FINDING_SEVERITY_CRITICAL,
}


def _timestamp(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def to_proto(report: HealthReport | None) -> machine_pb2.GpuHealth:
    """The report as Probe and the heartbeat carry it (None: an unset message)."""
    if report is None:
        return machine_pb2.GpuHealth()
    message = machine_pb2.GpuHealth(
        state=_STATE_TO_PROTO[report.state],
        findings=[
            machine_pb2.GpuFinding(
                kind=f.kind.value,
                severity=_SEVERITY_TO_PROTO[f.severity],
                gpu_index=f.gpu_index,
                code=f.code,
                message=f.message[:500],
                first_seen_time=_timestamp(f.first_seen),
                count=f.count,
            )
            for f in report.findings[:MAX_FINDINGS]
        ],
    )
    if report.read_at is not None:
        message.read_time.CopyFrom(_timestamp(report.read_at))
    return message


class GpuHealthWatcher:
    """Watches the GPUs through NVML and keeps the report current (thread-safe).

    ``nvml`` is the ``pynvml`` module (or the tests' fake); ``pause`` waits real seconds
    (injected: a test never sleeps). :meth:`start` initialises (one retry), :meth:`poll`
    reads the counters, :meth:`wait_for_event` takes one Xid event; :meth:`run` loops the
    last two on their own threads until stopped.
    """

    def __init__(
        self,
        nvml: Any,
        clock: Clock,
        policy: HealthPolicy,
        *,
        report_path: Path | None = None,
        pause: Callable[[float], object] = lambda seconds: None,
        previous: HealthReport | None = None,
    ) -> None:
        self.nvml = nvml
        self.clock = clock
        self.policy = policy
        self.report_path = report_path
        self.pause = pause
        self._lock = threading.Lock()
        self._findings: dict[tuple[str, int, int], Finding] = {}
        for finding in previous.findings if previous else ():
            self._findings[finding.key] = finding
        self._monitored = False
        self._read_at: datetime | None = previous.read_at if previous else None
        self._handles: list[Any] = []
        self._events: Any = None

    # -- start-up -------------------------------------------------------------------------

    def start(self, retry_after_s: float = 1.0) -> bool:
        """Initialise NVML and take a handle per GPU; one failure is retried once, a second
        is a critical finding. False when there is nothing to watch (no NVML or no GPU)."""
        if self.nvml is None:
            return self._unmonitored("no NVML bindings")
        first = self._try_init()
        if first is None:
            return self._ready()
        if isinstance(first, self.nvml.NVMLError_LibraryNotFound):
            return self._unmonitored(str(first))
        log.warning("GPU initialisation failed (%s); retrying once", first)
        self.pause(retry_after_s)
        second = self._try_init()
        if second is None:
            log.info("GPU initialisation succeeded on retry; not reported")
            return self._ready()
        self._add(Kind.INIT_FAILED, -1, 0, f"NVML initialisation failed twice: {first}; then {second}")
        self._publish()
        return False

    def _try_init(self) -> Exception | None:
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as err:
            return cast(Exception, err)
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
            self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self.nvml.NVMLError as err:
            self._shutdown_quietly()
            return cast(Exception, err)
        return None

    def _shutdown_quietly(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as err:
            log.debug("nvmlShutdown: %s", err)

    def _unmonitored(self, why: str) -> bool:
        log.info("GPU health not watched: %s", why)
        self._publish()
        return False

    def _ready(self) -> bool:
        if not self._handles:
            self._shutdown_quietly()
            return self._unmonitored("NVML sees no GPU")
        self._monitored = True
        self._register_events()
        self.poll()
        return True

    def _register_events(self) -> None:
        try:
            self._events = self.nvml.nvmlEventSetCreate()
        except self.nvml.NVMLError as err:
            log.warning("no NVML event set (%s): Xid events are not watched", err)
            return
        for index, handle in enumerate(self._handles):
            try:
                self.nvml.nvmlDeviceRegisterEvents(
                    handle, self.nvml.nvmlEventTypeXidCriticalError, self._events
                )
            except self.nvml.NVMLError_GpuIsLost:
                self._add(Kind.GPU_LOST, index, 0, "GPU is lost (NVML cannot reach it)")
            except self.nvml.NVMLError as err:
                log.warning("GPU %d: Xid events not watched (%s)", index, err)

    # -- readings --------------------------------------------------------------------------

    def poll(self) -> None:
        """Read every GPU's ECC counts, retired pages and remapped rows once."""
        if not self._monitored:
            return
        nvml = self.nvml
        for index, handle in enumerate(self._handles):
            try:
                self._read_ecc(index, handle)
                self._read_retirement(index, handle)
            except nvml.NVMLError_GpuIsLost:
                self._add(Kind.GPU_LOST, index, 0, "GPU is lost (NVML cannot reach it)")
            except nvml.NVMLError as err:
                log.warning("GPU %d: health read failed (%s)", index, err)
        with self._lock:
            self._read_at = self.clock.now()
        self._publish()

    def _optional(self, read: Callable[[], Any]) -> Any:
        """A reading this GPU may not offer (NOT_SUPPORTED: e.g. no ECC, pre-Ampere rows)."""
        try:
            return read()
        except self.nvml.NVMLError_NotSupported:
            return None

    def _read_ecc(self, index: int, handle: Any) -> None:
        nvml = self.nvml
        for error_type, kind, words in (
            (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, Kind.ECC_UNCORRECTABLE, "uncorrectable"),
            (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, Kind.ECC_CORRECTABLE, "correctable"),
        ):
            count = self._optional(
                functools.partial(
                    nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, nvml.NVML_VOLATILE_ECC
                )
            )
            if count:
                self._add(
                    kind, index, int(count), f"{int(count)} {words} ECC error(s) since the driver loaded"
                )

    def _read_retirement(self, index: int, handle: Any) -> None:
        nvml = self.nvml
        rows = self._optional(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            _corrected, _uncorrected, pending, failure = rows
            if failure:
                self._add(Kind.ROW_REMAP_FAILURE, index, 0, "row remapping failed: no spare row left")
            if pending:
                self._add(
                    Kind.ROW_REMAP_PENDING, index, 0, "row remapping pending (a GPU reset completes it)"
                )
            return
        pending_pages = self._optional(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending_pages == nvml.NVML_FEATURE_ENABLED:
            self._add(
                Kind.RETIRED_PAGES_PENDING, index, 0, "page retirement pending (a GPU reset completes it)"
            )

    def wait_for_event(self, timeout_ms: int) -> None:
        """Take at most one Xid event (waiting up to ``timeout_ms`` real milliseconds)."""
        if self._events is None:
            self.pause(timeout_ms / 1000.0)
            return
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(self._events, timeout_ms)
        except nvml.NVMLError_Timeout:
            return
        except nvml.NVMLError_GpuIsLost:
            self._add(Kind.GPU_LOST, -1, 0, "GPU is lost (NVML event wait)")
            self._publish()
            return
        except nvml.NVMLError as err:
            log.warning("NVML event wait failed (%s)", err)
            self.pause(timeout_ms / 1000.0)
            return
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return
        index = self._index_of(data.device)
        xid = int(data.eventData)
        self._add(Kind.XID, index, xid, f"Xid {xid} on GPU {index}")
        self._publish()

    def _index_of(self, device: Any) -> int:
        for index, handle in enumerate(self._handles):
            if handle == device:
                return index
        return -1

    # -- the report ------------------------------------------------------------------------

    def _add(self, kind: Kind, gpu_index: int, code: int, message: str) -> None:
        severity = classify(kind, code, self.policy)
        if severity is None:
            return
        finding = Finding(kind, severity, gpu_index, code, message, self.clock.now())
        with self._lock:
            seen = self._findings.get(finding.key)
            if seen is None:
                if len(self._findings) >= MAX_FINDINGS:
                    return
                self._findings[finding.key] = finding
                logger = log.error if severity == Severity.CRITICAL else log.warning
                logger("GPU health %s: %s", severity.value, message)
            elif kind == Kind.XID:
                self._findings[finding.key] = replace(seen, count=seen.count + 1)
            else:
                # A counter: the latest value, severity as it stands now, first seen kept.
                self._findings[finding.key] = replace(seen, code=code, message=message, severity=severity)

    def report(self) -> HealthReport:
        with self._lock:
            findings = tuple(sorted(self._findings.values(), key=_worst_first))
            read_at = self._read_at
        if not self._monitored and not findings:
            return HealthReport(HealthState.UNMONITORED, (), read_at)
        return HealthReport(state_of(findings), findings, read_at)

    def _publish(self) -> None:
        if self.report_path is None:
            return
        with report_lock(self.report_path):
            self._adopt(load_report(self.report_path))
            save_report(self.report_path, self.report())

    def _adopt(self, on_disk: HealthReport | None) -> None:
        """Findings another process recorded in the report (:func:`record_finding`)."""
        with self._lock:
            for finding in on_disk.findings if on_disk else ():
                if finding.key not in self._findings and len(self._findings) < MAX_FINDINGS:
                    self._findings[finding.key] = finding

    def run(self, stop: threading.Event, poll_s: float, event_wait_ms: int = 1000) -> None:
        """Watch until ``stop``: Xid events on a thread of their own, counters every ``poll_s``
        real seconds on this one."""
        if not self._monitored:
            return
        events = threading.Thread(
            target=self._event_loop, args=(stop, event_wait_ms), name="gpu-xid", daemon=True
        )
        events.start()
        while not stop.wait(poll_s):
            try:
                self.poll()
            except Exception:  # the watcher must outlive one bad read
                log.exception("GPU health poll failed")

    def _event_loop(self, stop: threading.Event, event_wait_ms: int) -> None:
        while not stop.is_set():
            try:
                self.wait_for_event(event_wait_ms)
            except Exception:
                log.exception("GPU event wait failed")
                stop.wait(event_wait_ms / 1000.0)


def _worst_first(finding: Finding) -> tuple[int, str, int, int]:
    return (
        0 if finding.severity == Severity.CRITICAL else 1,
        finding.kind.value,
        finding.gpu_index,
        finding.code,
    )
