"""Only the slot's own GPU: which NVIDIA device nodes a slot's sandbox gets.

The sandbox starts from an empty ``/dev`` (bubblewrap's minimal one), so a GPU node that
is not bound in is not there at all — which matters because NVIDIA's nodes are
world-writable by default. A slot gets the node(s) of its GPU(s) plus the control and UVM
nodes CUDA needs. On an L4 machine every slot time-shares the one GPU, so they all get
``/dev/nvidia0``: a GPU fault (an Xid, a hung context) can reach every slot (README).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

GPU_NODE = re.compile(r"^nvidia(\d+)$")
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def gpu_nodes(dev: Path = Path("/dev")) -> list[int]:
    """Indices of the GPUs whose nodes exist on this machine."""
    found = []
    try:
        entries = list(dev.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        match = GPU_NODE.match(entry.name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def gpus_for_slots(gpus: list[int], slots: int, first_slot: int, held: int) -> list[int]:
    """The GPUs an attempt on ``first_slot`` holding ``held`` slots may use.

    With at least as many GPUs as slots each slot owns its share; with fewer (an L4 machine,
    one GPU for several slots) slots time-share them round robin. A film holding every
    slot gets every GPU.
    """
    if not gpus:
        return []
    chosen: set[int] = set()
    per_slot = max(1, len(gpus) // slots)
    for slot in range(first_slot, first_slot + held):
        if len(gpus) >= slots:
            chosen.update(gpus[slot * per_slot : (slot + 1) * per_slot])
        else:
            chosen.add(gpus[slot % len(gpus)])
    return sorted(chosen)


def device_nodes(gpus: list[int], dev: Path = Path("/dev")) -> list[str]:
    """The device paths to bind for ``gpus`` (nothing when the machine has no GPU)."""
    if not gpus:
        return []
    nodes = [str(dev / f"nvidia{index}") for index in gpus]
    nodes += [str(dev / name) for name in SHARED_NODES if (dev / name).exists()]
    return nodes


def log_without_gpu(machine_slots: int) -> None:
    log.info(
        "no NVIDIA device node on this machine: GPU visibility per slot is skipped (%d slots see no GPU)",
        machine_slots,
    )
