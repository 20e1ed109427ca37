"""On a machine with an NVIDIA GPU, as root: the NVML readings, and what a walled slot sees.

    .venv/bin/python scripts/check_gpu_slot.py

Prints NVML's device count, names, utilisation and the processes it reports, then opens a
walled slot for slot 0 of a two-slot machine and lists, from inside the sandbox, the
NVIDIA device nodes it can see and what ``nvidia-smi -L`` says there. A slot must see only
its own GPU's node plus ``nvidiactl``/``nvidia-uvm``; on an L4 (one GPU) every slot sees
``/dev/nvidia0``. Exits 1 when a slot sees a node that is not its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.walls import devices
from gpufleet.agent.walls.setup import scratch_walls


def _nvml_readings() -> None:
    count = pynvml.nvmlDeviceGetCount()
    print(f"NVML: driver {pynvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)")
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        print(f"  {index}: {name} gpu {rates.gpu}% mem {rates.memory}% procs {len(procs)}")


def main() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        print(f"NVML: unavailable here ({err}); checking slot device visibility only")
    else:
        _nvml_readings()
    failures = 0
    with scratch_walls("gpu", 2) as (root, launcher, state):
        for slot in range(2):
            spec = JobSpec(attempt_id=f"gpu-{slot}", job_id="gpu", slot=slot)
            files = state.attempt(spec.attempt_id)
            files.folder.mkdir(parents=True)
            opened = launcher.open_slot(spec, files, root)
            argv = opened.command(["/bin/sh", "-c", "ls /dev | grep nvidia; nvidia-smi -L || true"])
            seen = subprocess.run(
                argv,
                env=opened.environment({}),
                cwd=opened.job_dir,
                preexec_fn=opened.preexec(),
                capture_output=True,
                text=True,
                check=False,
            )
            opened.close()
            own = {
                Path(n).name
                for n in devices.device_nodes(devices.gpus_for_slots(devices.gpu_nodes(), 2, slot, 1))
            }
            visible = {
                line for line in seen.stdout.splitlines() if line.startswith("nvidia") and "GPU" not in line
            }
            print(f"slot {slot}: sees {sorted(visible)}; its own {sorted(own)}\n{seen.stdout}{seen.stderr}")
            failures += bool(visible - own)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
