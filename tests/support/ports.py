"""Free loopback ports for a process that takes a block of consecutive ones (`gpufleet up
--port-offset` shifts 50051-50054, `--metrics-port-offset` 9451-9454)."""

from __future__ import annotations

import random
import socket


def free_block(count: int, exclude: range | None = None) -> int:
    """The first of ``count`` consecutive free ports, below the kernel's ephemeral range so
    that no client socket takes one meanwhile (and outside ``exclude``)."""
    for _ in range(100):
        base = random.randint(20_000, 30_000)
        if exclude is not None and (base in exclude or base + count - 1 in exclude):
            continue
        probes = [socket.socket() for _ in range(count)]
        try:
            for i, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no {count} consecutive free ports found")
