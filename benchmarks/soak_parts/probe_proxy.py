"""A TCP proxy in front of every local machine's agent, so the chaos can cut a machine's
probe path on loopback the way a partition would.

There is no firewall here (no iptables, and tc has no drop action in this kernel), so the
local driver's FAULT INJECTION hook (``probe_proxy``) reports each agent's address as the
port in ``disk/agent.proxy_port``, which this module writes once it listens in front of the
port in ``disk/agent.port``. Everything that dials the agent (the reaper's probes and idle
samples, the scheduler's StartJob/CancelJob) goes through it; the machine's own calls out
(the worker's heartbeats to the scheduler) do not — exactly the asymmetric cut the nets
must tell apart from a dead machine. A cut holds every byte both ways (connections stay
open and silent, new ones are accepted and never answered, as when SYN-ACKs or segments are
dropped); when it heals, the held connections are closed and callers reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

AGENT_PORT = "agent.port"
PROXY_PORT = "agent.proxy_port"


class ProbeProxies:
    def __init__(self, machines_root: Path, on_machine: Callable[[Path], None] | None = None) -> None:
        self.root = machines_root
        # Called once for each new machine folder, as soon as it appears (before its agent
        # has started, nearly always: the folder is made just before the agent is spawned).
        self.on_machine = on_machine
        self._known: set[str] = set()
        self.loop = asyncio.new_event_loop()
        # Relays still open when the soak ends are dropped with the process: not an error.
        self.loop.set_exception_handler(
            lambda loop, ctx: (
                None
                if "destroyed but it is pending" in str(ctx.get("message", ""))
                else loop.default_exception_handler(ctx)
            )
        )
        self._servers: dict[str, asyncio.base_events.Server] = {}
        self._healed: dict[str, asyncio.Event] = {}
        self._thread = threading.Thread(target=self._run, name="probe-proxies", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.create_task(self._watch())
        self.loop.run_forever()

    async def _watch(self) -> None:
        """Open a proxy for every agent that reported its port and has none (a new boot
        removes the old proxy's file: the driver deletes it with the port file)."""
        while True:
            for disk in self.root.glob("*/disk"):
                if disk.parent.name not in self._known:
                    self._known.add(disk.parent.name)
                    if self.on_machine is not None:
                        self.on_machine(disk.parent)
                machine_id = disk.parent.name
                if (disk / AGENT_PORT).exists() and not (disk / PROXY_PORT).exists():
                    await self._open(machine_id, disk)
            for machine_id in [m for m in self._servers if not (self.root / m).exists()]:
                self._servers.pop(machine_id).close()  # destroyed: its folder is gone
            await asyncio.sleep(0.05)

    async def _open(self, machine_id: str, disk: Path) -> None:
        old = self._servers.pop(machine_id, None)
        if old is not None:
            old.close()
        self._healed.setdefault(machine_id, asyncio.Event()).set()
        server = await asyncio.start_server(lambda r, w: self._relay(machine_id, disk, r, w), "127.0.0.1", 0)
        self._servers[machine_id] = server
        port = server.sockets[0].getsockname()[1]
        tmp = disk / f".{PROXY_PORT}.tmp"
        tmp.write_text(str(port))
        os.replace(tmp, disk / PROXY_PORT)

    async def _relay(
        self, machine_id: str, disk: Path, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        healed = self._healed[machine_id]
        try:
            if not healed.is_set():  # accepted, never answered
                await healed.wait()
                return
            try:
                port = int((disk / AGENT_PORT).read_text().strip())  # the agent's port now
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except (OSError, ValueError):
                return  # the agent is down: the caller sees the connection close
            try:
                await asyncio.gather(
                    self._pipe(machine_id, reader, up_writer), self._pipe(machine_id, up_reader, writer)
                )
            finally:
                up_writer.close()
        finally:
            writer.close()

    async def _pipe(self, machine_id: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        healed = self._healed[machine_id]
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(65536):
                if not healed.is_set():
                    await healed.wait()  # held, then the connection is dropped at the heal
                    return
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError):
            dst.close()

    def cut(self, machine_id: str) -> bool:
        """Hold every byte to and from ``machine_id``'s agent; False if it has no proxy."""
        if machine_id not in self._servers:
            return False
        self.loop.call_soon_threadsafe(self._healed[machine_id].clear)
        return True

    def heal(self, machine_id: str) -> None:
        event = self._healed.get(machine_id)
        if event is not None:
            self.loop.call_soon_threadsafe(event.set)

    def heal_all(self) -> None:
        for machine_id in list(self._healed):
            self.heal(machine_id)
