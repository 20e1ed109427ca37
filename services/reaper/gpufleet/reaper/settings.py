"""The reaper's typed settings (env prefix ``GPUFLEET_``, e.g. ``GPUFLEET_IDLE_STOP_AFTER_S``).

Every threshold and cadence is in seconds of the injected clock, so the demo's sped-up
clock shrinks them all alike. Built once in ``main()`` and passed down.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from gpufleet.common.settings import StoreSettings
from gpufleet.reaper.auto_destroy import AutoDestroyPolicy
from gpufleet.reaper.auto_stop import AutoStopPolicy
from gpufleet.reaper.boot_failure import BootFailurePolicy
from gpufleet.reaper.gpu_fault import GpuFaultPolicy
from gpufleet.reaper.idle_scanner import IdlePolicy
from gpufleet.reaper.incident_notifier import NotifierPolicy
from gpufleet.reaper.incident_webhook import WebhookFormat, WebhookPolicy
from gpufleet.reaper.lost_detector import LostPolicy
from gpufleet.reaper.provision_deadline import ProvisionDeadlinePolicy
from gpufleet.reaper.stuck_transition import StuckPolicy
from gpufleet.reaper.went_silent import FLOOR as WENT_SILENT_FLOOR
from gpufleet.reaper.went_silent import WentSilentPolicy

log = logging.getLogger(__name__)


class Settings(StoreSettings):
    listen_address: str = "127.0.0.1:50052"
    # Prometheus scrapes its metrics here (README "Metrics"; `gpufleet up` writes the job).
    metrics_address: str = "127.0.0.1:9452"

    # Cadences: chosen against the cost of what each net prevents (DESIGN §4).
    idle_scan_every_s: float = Field(default=30.0, gt=0)
    auto_stop_every_s: float = Field(default=30.0, gt=0)
    auto_destroy_every_s: float = Field(default=30.0, gt=0)
    provision_deadline_every_s: float = Field(default=60.0, gt=0)
    boot_failure_every_s: float = Field(default=60.0, gt=0)
    went_silent_every_s: float = Field(default=60.0, gt=0)
    lost_detector_every_s: float = Field(default=60.0, gt=0)
    stuck_transition_every_s: float = Field(default=60.0, gt=0)
    gpu_fault_every_s: float = Field(default=60.0, gt=0)

    # The money chain.
    idle_stop_after_s: float = Field(default=300.0, gt=0)
    idle_destroy_after_s: float = Field(default=7200.0, gt=0)
    idle_gpu_busy_percent: float = Field(default=5.0, ge=0, le=100)
    # The floor for encoder (NVENC), decoder (NVDEC) and memory utilisation: at or above it
    # on any of them a sample is traffic (a video job's encode phase can read ~0 % GPU).
    idle_engine_busy_percent: float = Field(default=1.0, gt=0, le=100)
    # Real seconds the agent samples for (a GPU's utilisation is measured in real time).
    idle_sample_window_s: float = Field(default=2.0, gt=0)
    idle_sample_concurrency: int = Field(default=16, ge=1)
    # A pass waits this long for its samples at most: a machine slower than that counts as
    # unreachable for the pass, and the money chain of every other machine goes on.
    idle_pass_deadline_s: float = Field(default=10.0, gt=0)
    agent_timeout_s: float = Field(default=5.0, gt=0)
    # Grace windows, counted from first_observed_at.
    auto_stop_grace_s: float = Field(default=600.0, ge=0)
    auto_destroy_grace_s: float = Field(default=600.0, ge=0)
    # A stop or destroy may wait on the provider's long operation: longer than any driver's
    # own bounded wait (the gcp driver waits up to 120 s for an operation), so the call is
    # answered rather than cut off with the machine left transitional by accident.
    provider_timeout_s: float = Field(default=300.0, gt=0)
    # Stops and destroys run in a bounded pool of their own, apart from the samples' and
    # probes' pools and from the nets' passes: this many at once, the rest wait their turn.
    provider_call_workers: int = Field(default=16, ge=1, le=512)
    # On a graceful stop, real seconds to wait for the calls in flight to answer while this
    # replica still leads (their outcomes are written under its lease); what is still out
    # after that stays transitional, for the stuck-transition net.
    provider_call_drain_s: float = Field(default=10.0, ge=0)

    # Provision deadline: the deadline itself is fixed by the scheduler at request time;
    # this is only the fallback for a row that has none (counted from requested_at).
    provision_deadline_default_s: float = Field(default=1200.0, gt=0)
    # Boot failure: the boot window, from first_observed_at (also its grace gate).
    boot_window_s: float = Field(default=1800.0, gt=0)
    # Went silent: raised to the hard floor (300 s), with a warning, when set lower.
    went_silent_after_s: float = Field(default=900.0, gt=0)
    went_silent_grace_s: float = Field(default=600.0, ge=0)
    # Lost detector: probe failing this long while the provider or worker says it is there.
    lost_after_s: float = Field(default=180.0, gt=0)
    lost_still_there_within_s: float = Field(default=300.0, gt=0)
    # Stuck transition: time in PROVISIONING/STARTING/STOPPING/DESTROYING before a fresh read.
    stuck_transition_after_s: float = Field(default=600.0, gt=0)
    # GPU fault: how long attempts ended on a faulted machine may hold their slots (their
    # processes told to stop) before its destroy goes ahead regardless.
    gpu_fault_slot_wait_s: float = Field(default=120.0, ge=0)

    # Ledger outcomes (quarantine lengths, lost-job back-off): shared, in StoreSettings.

    # The leader's gauges of the database's state (incidents open, quarantines, watchdogs'
    # last runs): how often it reads them. A scrape never queries.
    state_metrics_every_s: float = Field(default=15.0, gt=0)

    # The incident webhook (README "Incidents"): unset or empty, none. Where each incident
    # opened and resolved is posted; a secret (a Slack webhook's URL is its credential), so
    # never logged or shown.
    incident_webhook_url: SecretStr | None = None
    # `alertmanager`: Alertmanager's webhook JSON (version 4); `slack`: {"text": ...}.
    incident_webhook_format: WebhookFormat = WebhookFormat.ALERTMANAGER
    # How often the leader looks for changes (clock seconds), and how far back each look
    # reads, for rows committed after their own timestamp (clock seconds).
    incident_webhook_poll_s: float = Field(default=10.0, gt=0)
    incident_webhook_lookback_s: float = Field(default=600.0, ge=0)
    # Each post: its deadline, its tries and the first wait between them, doubling (real
    # seconds: they wait on a real server).
    incident_webhook_timeout_s: float = Field(default=5.0, gt=0)
    incident_webhook_attempts: int = Field(default=4, ge=1, le=20)
    incident_webhook_backoff_s: float = Field(default=1.0, ge=0)

    @field_validator("went_silent_after_s")
    @classmethod
    def _went_silent_floor(cls, value: float) -> float:
        floor = WENT_SILENT_FLOOR.total_seconds()
        if value < floor:
            log.warning(
                "went_silent_after_s=%s is below the hard floor; raised to %s",
                value,
                floor,
                extra={"fields": {"configured_s": value, "floor_s": floor}},
            )
            return floor
        return value

    @field_validator("incident_webhook_url", mode="before")
    @classmethod
    def _empty_url_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("incident_webhook_url")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        parts = urlsplit(value.get_secret_value())
        # Said without the URL itself: it may carry the receiver's credential.
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @model_validator(mode="after")
    def _stop_before_destroy(self) -> Settings:
        # The reversible action must always fall due before the irreversible one.
        if self.idle_destroy_after_s <= self.idle_stop_after_s:
            raise ValueError(
                "idle_destroy_after_s must be longer than idle_stop_after_s: "
                "stop (disk kept) always falls due before destroy"
            )
        return self

    def idle_policy(self) -> IdlePolicy:
        return IdlePolicy(
            stop_after=timedelta(seconds=self.idle_stop_after_s),
            destroy_after=timedelta(seconds=self.idle_destroy_after_s),
            gpu_busy_percent=self.idle_gpu_busy_percent,
            engine_busy_percent=self.idle_engine_busy_percent,
        )

    def auto_stop_policy(self) -> AutoStopPolicy:
        return AutoStopPolicy(
            grace=timedelta(seconds=self.auto_stop_grace_s),
            stop_after=timedelta(seconds=self.idle_stop_after_s),
        )

    def auto_destroy_policy(self) -> AutoDestroyPolicy:
        return AutoDestroyPolicy(
            grace=timedelta(seconds=self.auto_destroy_grace_s),
            destroy_after=timedelta(seconds=self.idle_destroy_after_s),
            stopped_for=timedelta(seconds=self.idle_destroy_after_s - self.idle_stop_after_s),
        )

    def provision_deadline_policy(self) -> ProvisionDeadlinePolicy:
        return ProvisionDeadlinePolicy(default_deadline=timedelta(seconds=self.provision_deadline_default_s))

    def boot_failure_policy(self) -> BootFailurePolicy:
        return BootFailurePolicy(window=timedelta(seconds=self.boot_window_s))

    def went_silent_policy(self) -> WentSilentPolicy:
        return WentSilentPolicy(
            silent_after=timedelta(seconds=self.went_silent_after_s),
            grace=timedelta(seconds=self.went_silent_grace_s),
        )

    def lost_policy(self) -> LostPolicy:
        return LostPolicy(
            lost_after=timedelta(seconds=self.lost_after_s),
            still_there_within=timedelta(seconds=self.lost_still_there_within_s),
        )

    def stuck_policy(self) -> StuckPolicy:
        return StuckPolicy(stuck_after=timedelta(seconds=self.stuck_transition_after_s))

    def gpu_fault_policy(self) -> GpuFaultPolicy:
        return GpuFaultPolicy(slot_release_wait=timedelta(seconds=self.gpu_fault_slot_wait_s))

    def incident_webhook(self) -> tuple[WebhookPolicy, NotifierPolicy] | None:
        """Where and how to post incidents, and how to look for them; None when turned off."""
        if self.incident_webhook_url is None:
            return None
        return (
            WebhookPolicy(
                url=self.incident_webhook_url.get_secret_value(),
                format=self.incident_webhook_format,
                timeout_s=self.incident_webhook_timeout_s,
                attempts=self.incident_webhook_attempts,
                backoff_s=self.incident_webhook_backoff_s,
            ),
            NotifierPolicy(poll_s=self.incident_webhook_poll_s, lookback_s=self.incident_webhook_lookback_s),
        )
