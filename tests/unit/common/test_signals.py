"""A stop signal is honoured even when it lands while the main thread is inside the very
``Event.wait`` it polls (the handler takes no lock): a real child process, signalled
hundreds of times at random moments of its polling loop, always stops."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = r"""
import sys, threading
from gpufleet.common.signals import stop_on_signals
stop = threading.Event()
stop_on_signals(stop)
print("ready", flush=True)
while not stop.wait(0.0001):
    pass
print("stopped", flush=True)
"""


def test_sigterm_during_a_tight_wait_loop_always_stops_the_process() -> None:
    for _ in range(20):
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.01)
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=10)
        assert out == "stopped\n" and child.returncode == 0
