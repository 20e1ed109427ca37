"""The parts of ``benchmarks/soak.py``, the soak with chaos (issue #27 item 6): each module
owns one concern — the probe proxies, the job-process sampler, the supervisor, the chaos
driver, the arrivals, and the end verdict."""
