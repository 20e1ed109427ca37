"""Typed settings shared by every gpufleet process.

Each service defines its own ``Settings`` subclass of :class:`BaseServiceSettings`, built
once in ``main()`` and passed down. Values come from ``GPUFLEET_*`` environment variables
and, optionally, a TOML file named by ``GPUFLEET_CONFIG_FILE`` (environment wins).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gpufleet.common.clock import Clock, clock_from_spec
from gpufleet.common.outcome_policy import OutcomePolicy


class BaseServiceSettings(BaseSettings):
    """What every process needs: where to listen, the clock, telemetry, identity."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    listen_address: str = "127.0.0.1:0"
    deployment_id: str = Field(default="local", min_length=1, max_length=63)
    clock: Literal["real", "scaled", "file"] = "real"
    clock_speed: float = Field(default=1.0, gt=0)
    clock_origin: float | None = None
    clock_file: str | None = None
    otlp_endpoint: str | None = None
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    # Every client call carries a deadline (seconds of real time).
    rpc_timeout_s: float = Field(default=10.0, gt=0)
    # When set, the bound port is written here once serving (tests and `gpufleet up` bind 0).
    port_file: str | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("GPUFLEET_CONFIG_FILE")
        if path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    def make_clock(self) -> Clock:
        return clock_from_spec(self.clock, self.clock_speed, self.clock_origin, self.clock_file)


class StoreSettings(BaseServiceSettings):
    """Services that own database access (scheduler, reaper, sweeper)."""

    database_url: str = "sqlite:///gpufleet.sqlite"
    provisioner_address: str = "127.0.0.1:50053"
    # Leader lease: renewed every lease_renew_s, lost after lease_ttl_s of the clock.
    lease_ttl_s: float = Field(default=15.0, gt=0)
    lease_renew_s: float = Field(default=5.0, gt=0)
    instance_name: str = Field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")

    # Ledger outcomes, the same for every detector in every service: how long a stocked-out
    # offering and a halted provider/region stay quarantined (0 = until a human clears it),
    # and the back-off before a job whose machine was lost or replaced runs again.
    offering_quarantine_ttl_s: float = Field(default=1800.0, ge=0)
    halt_provisioning_ttl_s: float = Field(default=0.0, ge=0)
    lost_retry_backoff_s: float = Field(default=30.0, ge=0)

    def outcome_policy(self) -> OutcomePolicy:
        return OutcomePolicy(
            offering_quarantine_ttl=_optional(self.offering_quarantine_ttl_s),
            halt_ttl=_optional(self.halt_provisioning_ttl_s),
            lost_retry_backoff_s=self.lost_retry_backoff_s,
        )


def _optional(seconds: float) -> timedelta | None:
    """0 means "until a human clears it"."""
    return timedelta(seconds=seconds) if seconds > 0 else None
