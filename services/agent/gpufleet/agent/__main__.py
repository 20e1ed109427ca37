"""``python -m gpufleet.agent``: the agent daemon of one machine.

It starts (or, after its own restart, adopts) the machine's worker, serves
``AgentService``, and only then writes ``agent.pid`` and ``agent.port`` into the state
directory — the files the provisioner's local driver waits for. It holds no job: jobs
live in runner processes the worker owns, so the daemon can be killed and restarted at
any moment without stopping one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from datetime import timedelta
from typing import Any

from gpufleet.agent import views
from gpufleet.agent.dead_man import Contact, DeadManSwitch
from gpufleet.agent.dead_man import Policy as DeadManPolicy
from gpufleet.agent.gpu_health import GpuHealthWatcher, health_file, load_report
from gpufleet.agent.pauses import PauseWatch
from gpufleet.agent.samplers import RequestCounter, choose_sampler, load_pynvml
from gpufleet.agent.servicer import AgentServicer, StateActivity
from gpufleet.agent.settings import AGENT_VERSION, Settings
from gpufleet.agent.statedir import StateDir, atomic_write_text
from gpufleet.agent.supervisor import WorkerSupervisor
from gpufleet.agent.walls.setup import UNWALLED_WARNING, WallsUnavailable, prepare_walls
from gpufleet.common.grpcserver import ServiceBinding, create_server, run_until_signalled
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc

log = logging.getLogger("gpufleet.agent")

# Real seconds the daemon waits for a fresh worker before serving anyway (Probe then
# tells the truth about start-up).
WORKER_START_TIMEOUT_S = 10.0


def _prepare_walls(settings: Settings, state: StateDir) -> None:
    """Build the walls before any job can arrive; a machine that cannot refuses every job."""
    if settings.walls == "off":
        log.warning(UNWALLED_WARNING)
        state.walls_error.unlink(missing_ok=True)
        return
    try:
        prepare_walls(settings)
    except WallsUnavailable as err:
        log.error("the walls between slots cannot be built; this machine refuses every job: %s", err)
        atomic_write_text(state.walls_error, f"{err}\n")
        return
    state.walls_error.unlink(missing_ok=True)


def _nvml_or_none() -> Any:
    """The NVML bindings, or None where the package itself is missing (no GPU support)."""
    try:
        return load_pynvml()
    except ImportError as err:
        log.info("no NVML bindings: %s", err)
        return None


def main() -> int:
    settings = Settings()
    settings.pin_clock_origin()
    transport = settings.start_process("agent", serve_metrics=True)
    state = StateDir(settings.agent_state_dir).ensure()
    # A previous daemon's files must not be mistaken for this one being ready.
    state.agent_port.unlink(missing_ok=True)
    state.agent_pid.unlink(missing_ok=True)
    clock = settings.make_clock()
    _prepare_walls(settings, state)

    supervisor = WorkerSupervisor(state, settings.child_env(dict(os.environ)))
    if supervisor.start_unless_alive() and not supervisor.wait_until_alive(WORKER_START_TIMEOUT_S):
        log.error("the worker did not come up; serving anyway so Probe can report it")

    requests = RequestCounter()
    pause = threading.Event()
    # Before the sampler: initialisation is retried once here, and a second failure is a
    # critical finding the worker's heartbeat carries (the sampler then falls back).
    gpu_health = GpuHealthWatcher(
        _nvml_or_none(),
        clock,
        settings.gpu_health_policy(),
        report_path=health_file(state.root),
        pause=pause.wait,
        previous=load_report(health_file(state.root)),
    )
    gpu_health.start(retry_after_s=settings.gpu_init_retry_after_s)
    sampler = choose_sampler(
        StateActivity(state, requests),
        load_nvml=load_pynvml,
        real_seconds=clock.real_seconds,
        pause=pause.wait,
    )
    contact = Contact(clock.now())
    pauses = PauseWatch()
    pauses.start()
    servicer = AgentServicer(
        machine_id=settings.machine_id,
        slots=settings.slots,
        state=state,
        supervisor=supervisor,
        sampler=sampler,
        requests=requests,
        clock=clock,
        pipeline_command=settings.pipeline_command,
        contact=contact,
        gpu_health=gpu_health,
        pauses=pauses,
    )
    full_name = agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
    server = create_server(
        settings.listen_address,
        [ServiceBinding(agent_service_pb2_grpc.add_AgentServiceServicer_to_server, servicer, full_name)],
        transport=transport,
        health_address=settings.health_listen_address,
    )

    atomic_write_text(state.agent_pid, f"{os.getpid()}\n")
    atomic_write_text(state.agent_port, f"{server.port}\n")
    log.info(
        "agent %s for machine %s serving on port %d (%d slots, sampler %s)",
        AGENT_VERSION,
        settings.machine_id,
        server.port,
        settings.slots,
        sampler.name,
    )
    stopping = threading.Event()
    switch = DeadManSwitch(
        clock,
        contact,
        busy=lambda: bool(views.active_specs(state)),
        policy=DeadManPolicy(timedelta(seconds=settings.dead_man_after_s), settings.dead_man_action),
        marker_dir=state.root,
    )
    threading.Thread(
        target=gpu_health.run, args=(stopping, settings.gpu_health_poll_s), name="gpu-health", daemon=True
    ).start()
    if settings.dead_man_action != "off":
        threading.Thread(
            target=switch.run, args=(stopping, settings.dead_man_every_s), name="dead-man", daemon=True
        ).start()
    try:
        run_until_signalled(server, threading.Event())
    finally:
        stopping.set()
    log.info("agent stopped; the worker and runners keep running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
