"""Typed settings shared by every gpufleet process.

Each service defines its own ``Settings`` subclass of :class:`BaseServiceSettings`, built
once in ``main()`` and passed down. Values come from ``GPUFLEET_*`` environment variables
and, optionally, a TOML file named by ``GPUFLEET_CONFIG_FILE`` (environment wins).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

import grpc
from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gpufleet.common import telemetry
from gpufleet.common.clock import Clock, clock_from_spec
from gpufleet.common.outcome_policy import OutcomePolicy
from gpufleet.common.telemetry import OtlpTarget, mark_insecure
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport, TransportNotConfigured

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


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
    # How the export to the collector is secured: "deployment" — mutual TLS, the collector
    # proving the deployment's collector identity (its certificate from the same CA);
    # "system" — TLS to a hosted collector with a public certificate (the system's roots);
    # "plaintext" — neither, said at start-up. A process running GPUFLEET_INSECURE exports
    # in plaintext whatever this says.
    otlp_trust: Literal["deployment", "system", "plaintext"] = "deployment"
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    # Every client call carries a deadline (seconds of real time).
    rpc_timeout_s: float = Field(default=10.0, gt=0)
    # When set, the bound port is written here once serving (tests and `gpufleet up` bind 0).
    port_file: str | None = None
    # Mutual TLS under the deployment's CA (README "Identities and authorization"): the trust
    # bundle, this process's certificate chain and its key. All three, or GPUFLEET_INSECURE.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Plaintext and unauthenticated, for local development only: said in every log line.
    insecure: bool = False
    # A plaintext port answering only the standard health check, for an orchestrator's probe.
    health_listen_address: str | None = None
    # Where the process serves its metrics for Prometheus (GET /metrics, host:port): HTTPS
    # with its own certificate, answering only the deployment's `metrics` identity;
    # plaintext when the process runs insecure. Empty: no listener. Each service's Settings
    # sets its own default port (README "Metrics"); a process that cannot bind it exits 2.
    metrics_address: str = ""

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

    def transport(self, who: str) -> Transport:
        """How this process serves and calls; raises TransportNotConfigured when neither
        TLS nor the explicit insecure flag is set. Insecure marks every log line."""
        transport = Transport.from_paths(
            self.deployment_id, self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.insecure, who
        )
        if transport.insecure:
            mark_insecure()
        return transport

    def require_transport(self, who: str) -> Transport:
        """:meth:`transport`, for a process's ``main()``: with neither TLS nor the explicit
        insecure flag it does not start — it says what to set, on stderr, and exits 2."""
        try:
            return self.transport(who)
        except TransportNotConfigured as exc:
            print(f"gpufleet-{who}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    def otlp_target(self, transport: Transport) -> OtlpTarget | None:
        """Where this process's traces and metrics go, and how (``otlp_trust``)."""
        if not self.otlp_endpoint:
            return None
        if transport.insecure:  # every line already says the process is insecure
            return OtlpTarget(self.otlp_endpoint, None)
        if self.otlp_trust == "deployment":
            return OtlpTarget(
                self.otlp_endpoint,
                transport.channel_credentials,
                transport.server_name(Role.COLLECTOR),
                follow=transport.tls,
            )
        if self.otlp_trust == "system":
            return OtlpTarget(self.otlp_endpoint, grpc.ssl_channel_credentials())
        return OtlpTarget(
            self.otlp_endpoint,
            None,
            plaintext_warning="traces and metrics leave in PLAINTEXT to "
            f"{self.otlp_endpoint} (GPUFLEET_OTLP_TRUST=plaintext)",
        )

    def start_process(
        self, service: str, who: str | None = None, *, serve_metrics: bool = False
    ) -> Transport:
        """A process's first step in ``main()``: its transport (or exit 2 with what to set,
        :meth:`require_transport`), then logging and telemetry, whose export to the collector
        goes over that transport's credentials. ``service`` names the process in logs and
        traces; ``who`` the part in messages, when it differs.

        ``serve_metrics``: this process is the one that serves the part's metrics on
        ``metrics_address`` (when set). Only a daemon asks for it: its helpers (an agent's
        worker, a scheduler's extra API processes) are started with the same environment
        and would bind the same address. It exits 2 when the address cannot be served."""
        transport = self.require_transport(who or service)
        scrape = None
        if serve_metrics and self.metrics_address:
            from prometheus_client import CollectorRegistry

            # Its own registry, not prometheus_client's global one: what is served is the
            # OpenTelemetry catalogue (and target_info), nothing a library registered.
            scrape = CollectorRegistry(auto_describe=True)
        telemetry.configure(
            service,
            otlp=self.otlp_target(transport),
            level=self.log_level,
            log_format=self.log_format,
            scrape=scrape,
        )
        if scrape is not None:
            self._serve_metrics(scrape, transport, who or service)
        return transport

    def _serve_metrics(self, registry: CollectorRegistry, transport: Transport, who: str) -> None:
        from gpufleet.common.metrics_listener import MetricsAddressError, serve_metrics

        try:
            serve_metrics(self.metrics_address, registry, transport)
        except (OSError, MetricsAddressError) as exc:
            # The agent reads its own variable (agent/settings.py says why).
            variable = (
                type(self).model_fields["metrics_address"].validation_alias or "GPUFLEET_METRICS_ADDRESS"
            )
            message = (
                f"gpufleet-{who}: cannot serve metrics on {self.metrics_address!r}: {exc} "
                f"(set {variable} to a free host:port, or empty for no metrics listener)"
            )
            logging.getLogger(__name__).error("%s", message)  # logging writes to stderr
            raise SystemExit(2) from None

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
    # After the database comes back from an outage, the leader's passes wait this long
    # (clock seconds) so every live machine has reported again (the agents' heartbeat is
    # 10 s) before a net reads their silence (gpufleet.common.loops).
    outage_settle_s: float = Field(default=30.0, ge=0)

    # Ledger outcomes, the same for every detector in every service: how long a stocked-out
    # offering and a halted provider/region stay quarantined (0 = until a human clears it),
    # and the back-off before a job whose machine was lost or replaced runs again.
    offering_quarantine_ttl_s: float = Field(default=1800.0, ge=0)
    halt_provisioning_ttl_s: float = Field(default=0.0, ge=0)
    lost_retry_backoff_s: float = Field(default=30.0, ge=0)
    # Ends a job cannot have caused (a start taken back, a GPU fault, a machine the cloud
    # took back, the machine's lease fence) spend this budget, not the patient one: a wide
    # bound against a loop, never a judgement of the job.
    disruption_budget: int = Field(default=20, ge=0)

    def outcome_policy(self) -> OutcomePolicy:
        return OutcomePolicy(
            offering_quarantine_ttl=_optional(self.offering_quarantine_ttl_s),
            halt_ttl=_optional(self.halt_provisioning_ttl_s),
            lost_retry_backoff_s=self.lost_retry_backoff_s,
            disruption_budget=self.disruption_budget,
        )


def _optional(seconds: float) -> timedelta | None:
    """0 means "until a human clears it"."""
    return timedelta(seconds=seconds) if seconds > 0 else None
