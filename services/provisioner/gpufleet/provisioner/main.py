"""``python -m gpufleet.provisioner``: ProvisionerService on GPUFLEET_LISTEN_ADDRESS.

Stopping it (SIGTERM) stops serving gracefully and leaves every machine running: local
machines live in their own sessions, cloud machines in their clouds.
"""

from __future__ import annotations

import logging
import threading

from gpufleet.common.catalog import load_catalog
from gpufleet.common.grpcserver import ServiceBinding, announce_port, create_server, run_until_signalled
from gpufleet.provisioner.drivers.factory import build_drivers
from gpufleet.provisioner.service import ProvisionerService
from gpufleet.provisioner.settings import Settings
from gpufleet.v1 import provisioner_service_pb2, provisioner_service_pb2_grpc

log = logging.getLogger("gpufleet.provisioner")


def main() -> None:
    settings = Settings()
    transport = settings.start_process("provisioner", serve_metrics=True)
    clock = settings.make_clock()
    servicer = ProvisionerService(build_drivers(settings, clock), load_catalog(settings.catalog_file))
    server = create_server(
        settings.listen_address,
        [
            ServiceBinding(
                provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                servicer,
                provisioner_service_pb2.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
            )
        ],
        transport=transport,
        health_address=settings.health_listen_address,
    )
    announce_port(server.port, settings.port_file)
    log.info(
        "provisioner serving on port %d with drivers %s",
        server.port,
        ",".join(p.value for p in servicer.drivers),
        extra={"fields": {"port": server.port}},
    )
    run_until_signalled(server, threading.Event())


if __name__ == "__main__":
    main()
