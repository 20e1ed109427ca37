"""``python -m gpufleet.sweeper`` as a real process: serves, reconciles, stops on SIGTERM."""

from __future__ import annotations

from pathlib import Path

from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.support.procs import start_service
from tests.support.scripted_services import serve_provisioner


def test_sweeper_process_serves_and_stops_on_sigterm(pg_url: str, tmp_path: Path) -> None:
    with serve_provisioner() as provisioner:
        proc = start_service(
            "sweeper",
            tmp_path,
            {
                "GPUFLEET_DATABASE_URL": pg_url,
                "GPUFLEET_PROVISIONER_ADDRESS": provisioner.address,
                "GPUFLEET_CLOCK": "real",
            },
        )
        try:
            with proc.channel() as channel:
                stub = sweeper_service_pb2_grpc.SweeperServiceStub(channel)
                done = stub.RunSweep(
                    sweeper_service_pb2.RunSweepRequest(
                        kind=sweeper_service_pb2.SWEEP_KIND_INVENTORY_RECONCILE
                    ),
                    timeout=10,
                )
                listed = stub.ListSweeps(sweeper_service_pb2.ListSweepsRequest(), timeout=5)
            assert done.sweep_id in [s.sweep_id for s in listed.sweeps]
            assert provisioner.ops("list")
        finally:
            proc.stop(timeout=45)  # the service bounds its own stop at grace 5 s + 35 s join
    assert proc.process.returncode == 0, proc.log()
