"""The reaper's typed settings (env prefix ``GPUFLEET_``, e.g. ``GPUFLEET_IDLE_STOP_AFTER_S``).

Every threshold and cadence is in seconds of the injected clock, so the demo's sped-up
clock shrinks them all alike. Built once in ``main()`` and passed down.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from gpufleet.common.settings import StoreSettings
from gpufleet.reaper.auto_destroy import AutoDestroyPolicy
from gpufleet.reaper.auto_stop import AutoStopPolicy
from gpufleet.reaper.idle_scanner import IdlePolicy


class Settings(StoreSettings):
    listen_address: str = "127.0.0.1:50052"

    # Cadences: chosen against the cost of what each net prevents (DESIGN §4).
    idle_scan_every_s: float = Field(default=30.0, gt=0)
    auto_stop_every_s: float = Field(default=30.0, gt=0)
    auto_destroy_every_s: float = Field(default=30.0, gt=0)

    # The money chain.
    idle_stop_after_s: float = Field(default=300.0, gt=0)
    idle_destroy_after_s: float = Field(default=7200.0, gt=0)
    idle_gpu_busy_percent: float = Field(default=5.0, ge=0, le=100)
    # Real seconds the agent samples for (a GPU's utilisation is measured in real time).
    idle_sample_window_s: float = Field(default=2.0, gt=0)
    idle_sample_concurrency: int = Field(default=16, ge=1)
    agent_timeout_s: float = Field(default=5.0, gt=0)
    # Grace windows, counted from first_observed_at.
    auto_stop_grace_s: float = Field(default=600.0, ge=0)
    auto_destroy_grace_s: float = Field(default=600.0, ge=0)
    # A stop or destroy may wait on the provider's long operation.
    provider_timeout_s: float = Field(default=120.0, gt=0)

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
        )

    def auto_stop_policy(self) -> AutoStopPolicy:
        return AutoStopPolicy(grace=timedelta(seconds=self.auto_stop_grace_s))

    def auto_destroy_policy(self) -> AutoDestroyPolicy:
        return AutoDestroyPolicy(grace=timedelta(seconds=self.auto_destroy_grace_s))
