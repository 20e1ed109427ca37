"""The provisioner's settings (env ``GPUFLEET_*``, optional TOML in ``GPUFLEET_CONFIG_FILE``).

Built once in ``main()`` and passed down; nothing reads them as module globals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from gpufleet.common.settings import BaseServiceSettings
from gpufleet.common.trust.pki import MachineIssuer
from gpufleet.provisioner.drivers.base import Provider


class Settings(BaseServiceSettings):
    """Which drivers run, and how each is set up.

    ``GPUFLEET_DRIVERS`` is a comma-separated list (``local,sim``); the local driver's
    agent command (``GPUFLEET_LOCAL_AGENT_COMMAND``) is a JSON list of argv.
    """

    listen_address: str = "127.0.0.1:50053"
    # Prometheus scrapes its metrics here (README "Metrics"; `gpufleet up` writes the job).
    metrics_address: str = "127.0.0.1:9453"
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
    # The machine CA (never the root): each new machine is born with its own certificate,
    # signed by it. Unset under TLS: machines get none and their agents refuse to start.
    tls_machine_ca_cert_file: str | None = None
    tls_machine_ca_key_file: str | None = None

    def machine_issuer(self) -> MachineIssuer | None:
        if not (self.tls_machine_ca_cert_file and self.tls_machine_ca_key_file and self.tls_ca_file):
            return None
        return MachineIssuer.load(
            Path(self.tls_ca_file),
            Path(self.tls_machine_ca_cert_file),
            Path(self.tls_machine_ca_key_file),
            self.deployment_id,
        )

    # sim: an in-memory provider with scripted latencies on the clock.
    sim_boot_latency_s: float = Field(default=0.0, ge=0)
    sim_start_latency_s: float = Field(default=0.0, ge=0)
    sim_stop_latency_s: float = Field(default=0.0, ge=0)
    # Zones where create and start fail with INSUFFICIENT_CAPACITY (comma-separated).
    sim_stockout_zones: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # 0: unlimited; beyond it create is QUOTA_EXCEEDED.
    sim_max_instances: int = Field(default=0, ge=0)

    # aws: EC2 through boto3. Credentials come only from boto3's standard chain (never a
    # setting). Regions are comma-separated; images (region -> AMI id: production needs a
    # GPU image per region), subnets (zone -> subnet id) and security groups (region ->
    # ids) are JSON objects, e.g. GPUFLEET_AWS_IMAGES='{"us-east-1": "ami-0123..."}'.
    aws_regions: Annotated[list[str], NoDecode] = Field(default_factory=list)
    aws_images: dict[str, str] = Field(default_factory=dict)
    aws_subnets: dict[str, str] = Field(default_factory=dict)
    aws_security_groups: dict[str, list[str]] = Field(default_factory=dict)
    # An EC2-compatible endpoint instead of AWS's (an emulator such as moto's server).
    aws_endpoint_url: str | None = None
    aws_connect_timeout_s: float = Field(default=5.0, gt=0)
    aws_read_timeout_s: float = Field(default=30.0, gt=0)
    # Attempts per EC2 call, the first included (botocore's standard retry mode).
    aws_max_attempts: int = Field(default=3, ge=1, le=10)
    aws_page_size: int = Field(default=500, ge=5, le=1000)
    # The agent's port on an instance's private address.
    aws_agent_port: int = Field(default=50060, ge=1, le=65535)

    # gcp: Compute Engine through google-cloud-compute (REST). Credentials come only from
    # the SDK's standard chain (application default credentials), never from a setting.
    gcp_project: str = ""
    # Zones this provisioner may create in (comma-separated; empty: whatever the offering
    # names). list() reads every zone of the project through aggregatedList regardless.
    gcp_zones: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The machine recipe: a GPU-ready boot image (required to create) and its disk.
    gcp_image: str = ""
    gcp_boot_disk_gb: int = Field(default=100, ge=10)
    gcp_boot_disk_type: str = "pd-balanced"
    gcp_network: str = "global/networks/default"
    gcp_subnetwork: str = ""
    # Off: a machine has only an internal address and reaches out through Cloud NAT.
    gcp_external_ip: bool = False
    gcp_agent_port: int = Field(default=50060, ge=1, le=65535)
    # A long operation is waited on for at most gcp_operation_wait_s of the clock (then
    # NOT_YET_DONE); one poll (zoneOperations.wait) holds at most gcp_operation_poll_s.
    gcp_operation_wait_s: float = Field(default=120.0, gt=0)
    gcp_operation_poll_s: float = Field(default=20.0, gt=0)
    # Real seconds per HTTP request, and the retry budget of reads on 429/5xx (0: none).
    gcp_request_timeout_s: float = Field(default=30.0, gt=0)
    gcp_read_retry_s: float = Field(default=5.0, ge=0)
    gcp_page_size: int = Field(default=500, ge=1, le=500)
    # A retry within this many clock seconds reuses the requestId (a lost answer is harmless);
    # after it, a new one (GCE replays a failed request's error for as long as it remembers it).
    gcp_request_id_window_s: float = Field(default=600.0, gt=0)
    # A Compute REST endpoint instead of Google's: an emulator or the tests' fake.
    gcp_api_endpoint: str | None = None
    # Emulators and tests only: call without any credentials. Never for a real project.
    gcp_anonymous_credentials: bool = False

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

    @field_validator("aws_regions", mode="before")
    @classmethod
    def _split_aws_regions(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("gcp_zones", mode="before")
    @classmethod
    def _split_gcp_zones(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
