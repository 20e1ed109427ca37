"""systemd's part on a soak machine: runs the agent (``python -m gpufleet.agent``) as its
child and starts it again 2 s after it dies (``Restart=always``, ``RestartSec=2``), inside
the machine's own session and process group, as systemd does inside a VM.

The soak makes it each local machine's agent command (the provisioner's
``local_agent_command``), so when the chaos kills an agent daemon the machine goes on,
its worker and runners untouched, and the restarted agent adopts them. A SIGTERM (the
provider stopping or destroying the machine ends its whole process group) stops it for
good; SIGKILL of the group takes it with everything else.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

RESTART_SEC = 2.0
AGENT = (sys.executable, "-m", "gpufleet.agent")


def main() -> int:
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts = 0
    while True:
        child = subprocess.Popen(AGENT)  # same session, same group: part of the machine
        code = child.wait()
        if stopping:
            return code
        restarts += 1
        with Path("agent_unit.log").open("a") as log:  # in the machine's folder (its cwd)
            log.write(f"{time.time():.3f} agent exited {code}; restart {restarts} in {RESTART_SEC:g} s\n")
        time.sleep(RESTART_SEC)
        if stopping:
            return code


if __name__ == "__main__":
    sys.exit(main())
