"""How long a net took to act on a failure: from the failure's first sign to the act.

An operator's question is "how long does a wedged machine bill before something acts?".
Each net answers it from the one moment its own question is counted from — never from
when the net happened to look — so a slow cadence, a long threshold or a stuck pass all
show up as latency:

==================  ===================================  =====================================
net                 act                                  first sign
==================  ===================================  =====================================
went_silent         destroy claimed                      the worker's last report
                                                         (``worker_report_at``)
provision_deadline  destroy claimed                      the request (``requested_at``): the
                                                         deadline runs from it
boot_failure        destroy claimed                      this life's first observation
                                                         (``first_observed_at``): the boot
                                                         window runs from it
lost_detector       marked lost                          the probe's first failure in the
                                                         streak (``probe_failed_since``)
auto_stop           stop claimed                         idle since: the first quiet sample,
                                                         ``stop_due_at - stop_after``
auto_destroy        destroy claimed                      idle since: the first quiet sample,
                                                         ``destroy_due_at - destroy_after``
stuck_transition    stop/destroy re-issued, transition   the transition's start
                    finished, or a human alerted         (``state_changed_at``)
gpu_fault           destroy claimed                      the control plane's first act on the
                                                         fault (its first ``gpu_fault`` ledger
                                                         row), else the findings' read time
                                                         (``gpu_health_at``)
==================  ===================================  =====================================

The sweeper's inventory reconcile records the same metric for the machines the provider
took back (net ``inventory_reconcile``; see ``gpufleet.sweeper.machine_loss``).

"Act" is the committed claim, not the provider call: the intent, the transitional state
and the ledger row are what the net decided, and the call that follows is the
provider's latency (``gpufleet.provider.call.duration``). A measurement is recorded only
after the act's transaction has committed, so a claim the row refused
(``CHANGED_SINCE_SCAN``) or a fenced write is never counted. The idle chain's first sign
is derived from the timers it armed (the idle scanner arms both at its first quiet sample,
``stop_after`` and ``destroy_after`` ahead): exact while those settings are unchanged
between the arming and the act.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufleet.common.metrics.catalog import REAPER_DETECTION_LATENCY
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.refusal import MachineSnapshot

__all__ = [
    "DetectionLatency",
    "boot_window_start",
    "gpu_fault_reported",
    "idle_since",
    "last_report",
    "probe_failing_since",
    "provision_requested",
    "transition_start",
]


class DetectionLatency:
    """One net's detection-latency histogram."""

    def __init__(self, net: str, instruments: Instruments = PROCESS) -> None:
        self.net = net
        self._histogram = instruments.histogram(REAPER_DETECTION_LATENCY)

    def acted(self, first_sign: datetime | None, at: datetime) -> None:
        """Record one committed act at ``at``; nothing when the first sign is unknown (a
        row missing the column its net counts from has no honest latency to give)."""
        if first_sign is None:
            return
        seconds = max(0.0, (at - first_sign).total_seconds())
        self._histogram.record(seconds, {"net": self.net})


def last_report(machine: MachineSnapshot) -> datetime | None:
    """went_silent: the worker's last report; the silence began right after it."""
    return machine.worker_report_at


def provision_requested(machine: MachineSnapshot, default_deadline: timedelta) -> datetime | None:
    """provision_deadline: the request, which the deadline is counted from (for a row with
    a deadline but, unexpectedly, no request time: the deadline less the default window)."""
    if machine.requested_at is not None:
        return machine.requested_at
    if machine.provision_deadline_at is not None:
        return machine.provision_deadline_at - default_deadline
    return None


def boot_window_start(machine: MachineSnapshot) -> datetime | None:
    """boot_failure: when this platform first saw this life running (the boot window's
    start, never the provider's launch time)."""
    return machine.first_observed_at


def probe_failing_since(machine: MachineSnapshot) -> datetime | None:
    """lost_detector: the first failed probe of the streak that made the machine lost."""
    return machine.probe_failed_since


def idle_since(due_at: datetime | None, armed_ahead: timedelta) -> datetime | None:
    """auto_stop / auto_destroy: the first quiet sample, when the idle scanner armed
    ``due_at`` that far ahead."""
    return due_at - armed_ahead if due_at is not None else None


def transition_start(machine: MachineSnapshot) -> datetime | None:
    """stuck_transition: when the machine entered the transitional state it is stuck in."""
    return machine.state_changed_at


def gpu_fault_reported(
    first_fault_row_at: datetime | None, health_read_at: datetime | None
) -> datetime | None:
    """gpu_fault: when the scheduler first acted on the critical finding (cordon and the
    ``gpu_fault`` row, on the control plane's clock), else when the stored findings were
    read. Not the finding's own ``first_seen``: that is the machine's clock."""
    return first_fault_row_at if first_fault_row_at is not None else health_read_at
