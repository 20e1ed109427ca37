"""The provisioner's settings (env ``GPUFLEET_*``, optional TOML in ``GPUFLEET_CONFIG_FILE``).

Built once in ``main()`` and passed down; nothing reads them as module globals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from gpufleet.common.settings import BaseServiceSettings
from gpufleet.provisioner.drivers.base import Provider
from pydantic import Field, field_validator
from pydantic_settings import NoDecode


class Settings(BaseServiceSettings):
    """Which drivers run, and how each is set up.

    ``GPUFLEET_DRIVERS`` is a comma-separated list (``local,sim``); the local driver's
    agent command (``GPUFLEET_LOCAL_AGENT_COMMAND``) is a JSON list of argv.
    """

    listen_address: str = "127.0.0.1:50053"
    drivers: Annotated[list[Provider], NoDecode] = Field(default_factory=lambda: [Provider.LOCAL])
    catalog_file: str | None = None

    # local: machines as agent processes under local_root.
    local_root: Path = Path("var/machines")
    # Machine n listens on base + n (DESIGN §1: 50060 + n); 0: each agent binds an ephemeral port.
    local_agent_base_port: int = Field(default=50060, ge=0, le=65535)
    # None: [sys.executable, "-m", "gpufleet.agent"].
    local_agent_command: list[str] | None = None
    local_agent_wait_s: float = Field(default=15.0, ge=0)
    local_stop_grace_s: float = Field(default=5.0, ge=0)
    # 0: unlimited; beyond it create is INSUFFICIENT_CAPACITY.
    local_max_machines: int = Field(default=8, ge=0)
    # Handed to each local agent, whose worker reports to the scheduler.
    scheduler_address: str = "127.0.0.1:50051"

    # sim: an in-memory provider with scripted latencies on the clock.
    sim_boot_latency_s: float = Field(default=0.0, ge=0)
    sim_start_latency_s: float = Field(default=0.0, ge=0)
    sim_stop_latency_s: float = Field(default=0.0, ge=0)
    # Zones where create and start fail with INSUFFICIENT_CAPACITY (comma-separated).
    sim_stockout_zones: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # 0: unlimited; beyond it create is QUOTA_EXCEEDED.
    sim_max_instances: int = Field(default=0, ge=0)

    @field_validator("drivers", mode="before")
    @classmethod
    def _split_drivers(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().upper() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [str(v).upper() for v in value]
        return value

    @field_validator("sim_stockout_zones", mode="before")
    @classmethod
    def _split_zones(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
