"""A job that tries to cross the walls (the escape suite's pipeline; standard library only).

It runs behind the walls exactly as a tenant's job would, as the slot's user under the
system Python, and reads what to do from its spec's tenant values: ``role`` picks a
behaviour, ``params`` (JSON) names what to aim at — host paths, pids and ports the test
found from outside. Every attempt is recorded as one JSON line ``{"check", "crossed",
"detail"}`` on stdout, so the test names the wall that did not hold.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SPEC = json.loads(Path(os.environ["GPUFLEET_JOB_SPEC"]).read_text())
VALUES = SPEC["tenant_values"]
PARAMS = json.loads(VALUES.get("params", "{}"))
LIBC = ctypes.CDLL(None, use_errno=True)


def report(check: str, crossed: bool, detail: str = "") -> None:
    print(json.dumps({"check": check, "crossed": crossed, "detail": detail[:300]}), flush=True)


def attempt(check: str, action) -> None:  # type: ignore[no-untyped-def]
    """Run ``action``; it crossed the wall if it returns without raising."""
    try:
        detail = action()
    except Exception as err:  # the wall held: say how
        report(check, False, f"{type(err).__name__}: {err}")
        return
    report(check, True, str(detail))


def read(path: str) -> str:
    return Path(path).read_text()[:100]


def connect_tcp(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2):
        return f"connected to {host}:{port}"


def victim() -> int:
    """Slot B: leaves things to find, serves a socket, then lives until told to stop."""
    secret = PARAMS.get("secret", "b-secret")
    for place in ("/job", os.environ["HOME"], "/tmp", "/var/tmp", "/dev/shm"):
        Path(place, "b-secret").write_text(secret)
    shmid = LIBC.shmget(0xB0B, 4096, 0o1666)  # IPC_CREAT | 0666
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0gpufleet-escape-b")
    abstract.listen(4)
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", 7777))
    tcp.listen(4)
    print(json.dumps({"victim": "ready", "shmid": shmid}), flush=True)
    stop = Path("/job/stop")
    deadline = time.monotonic() + float(PARAMS.get("live_s", 120))
    while time.monotonic() < deadline:
        if any(Path(p).exists() for p in ("/tmp/a-was-here", "/dev/shm/a-was-here", "/var/tmp/a-was-here")):
            report("A's temporary files seen from B", True, "a-was-here")
        time.sleep(0.05)
    del stop
    return 0


def prober() -> int:
    b_dir = PARAMS["b_job_dir"]
    b_attempt = PARAMS["b_attempt"]
    attempt("read B's folder directly", lambda: read(f"{b_dir}/b-secret"))
    attempt("read B's folder through ..", lambda: read(f"/job/../{b_attempt}/b-secret"))
    attempt("read B's folder through .. on its host path", lambda: read(f"{b_dir}/../{b_attempt}/b-secret"))

    def symlink() -> str:
        os.symlink(f"{b_dir}/b-secret", "/job/link-to-b")
        return read("/job/link-to-b")

    attempt("read B's folder through a symlink", symlink)

    def hardlink() -> str:
        os.link(f"{b_dir}/b-secret", "/job/hard-to-b")
        return read("/job/hard-to-b")

    attempt("read B's folder through a hardlink", hardlink)
    for pid in PARAMS["b_pids"] + [PARAMS["agent_pid"]]:
        attempt(
            f"read /proc/{pid}/root/job of another process",
            lambda pid=pid: read(f"/proc/{pid}/root/job/b-secret"),
        )
        attempt(f"read /proc/{pid}/environ", lambda pid=pid: read(f"/proc/{pid}/environ"))
        attempt(f"read /proc/{pid}/cmdline", lambda pid=pid: read(f"/proc/{pid}/cmdline"))
        attempt(f"signal pid {pid}", lambda pid=pid: os.kill(pid, 0) or "signal 0 delivered")
        attempt(f"kill pid {pid}", lambda pid=pid: os.kill(pid, signal.SIGKILL) or "SIGKILL delivered")

        def ptrace(target: int = pid) -> str:
            if LIBC.ptrace(16, target, None, None) != 0:  # PTRACE_ATTACH
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            return "attached"

        attempt(f"ptrace pid {pid}", ptrace)
    attempt("see other processes in /proc", lambda: _others_in_proc())
    attempt("list the machine's jobs", lambda: os.listdir(PARAMS["jobs_dir"]))
    attempt("list the agent's attempts", lambda: os.listdir(PARAMS["attempts_dir"]))
    for place in ("/tmp", "/var/tmp", "/dev/shm"):
        Path(place, "a-was-here").write_text("a")
        attempt(f"find B's file in {place}", lambda place=place: read(f"{place}/b-secret"))

    def shm() -> str:
        shmid = LIBC.shmget(0xB0B, 0, 0)
        if shmid < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return f"shmid {shmid}"

    attempt("attach B's SysV shared memory", shm)

    def abstract() -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect("\0gpufleet-escape-b")
        return "connected"

    attempt("connect to B's abstract Unix socket", abstract)
    attempt("connect to B's loopback port", lambda: connect_tcp("127.0.0.1", 7777))
    for port in PARAMS["ports"]:
        attempt(
            f"connect to control-plane port {port} on loopback",
            lambda port=port: connect_tcp("127.0.0.1", port),
        )
    attempt("connect to the cloud metadata service", lambda: connect_tcp("169.254.169.254", 80))
    attempt("connect to a private-range address", lambda: connect_tcp("10.0.0.1", 80))
    attempt("look up a name", lambda: socket.getaddrinfo("example.com", 443))
    attempt("look up the metadata service's name", lambda: socket.getaddrinfo("metadata.google.internal", 80))
    for argv in (
        ["su", "root", "-c", "id -u"],
        ["sudo", "-n", "id", "-u"],
        ["unshare", "-Ur", "id", "-u"],
        ["mount", "-t", "tmpfs", "none", "/tmp"],
    ):
        attempt(f"gain privilege with {argv[0]}", lambda argv=argv: _privileged(argv))
    attempt("keep a capability", _capabilities)
    for path in (
        "/etc/gpufleet-escape",
        "/usr/gpufleet-escape",
        "/usr/bin/gpufleet-escape",
        f"{PARAMS['agent_state_dir']}/gpufleet-escape",
    ):
        attempt(f"write {path}", lambda path=path: Path(path).write_text("x") or "written")
    attempt("hold a descriptor of the machine's files", _descriptors)
    attempt("see a platform or cloud credential", _credentials)
    attempt("see the machine's hostname", lambda: _hostname(PARAMS["host_hostname"]))
    # The symlink trap: links to /etc left for the wipe to follow.
    os.symlink("/etc", "/job/etc-link")
    os.symlink("/etc", os.path.join(os.environ["HOME"], "etc-link"))
    os.makedirs(os.path.join(os.environ["HOME"], "deep"), exist_ok=True)
    os.symlink("/etc/passwd", os.path.join(os.environ["HOME"], "deep", "passwd-link"))
    os.symlink("/etc", "/tmp/etc-link")
    attempt("replace the job's folder by a link to /etc", _replace_job_dir)
    return 0


def _others_in_proc() -> str:
    mine = {os.getpid(), os.getppid()}
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    others = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pid not in mine and "probe_job" not in cmd and "bwrap" not in cmd:
            others.append(f"{pid}:{cmd[:40]}")
    if others:
        return ", ".join(others)
    raise PermissionError(f"only this job's own processes are visible ({len(pids)})")


def _privileged(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except FileNotFoundError as err:
        raise PermissionError(f"{argv[0]} is not there") from err
    if done.returncode == 0 and (done.stdout.strip() == "0" or argv[0] == "mount"):
        return f"{argv[0]} succeeded: {done.stdout.strip()}"
    raise PermissionError(f"exit {done.returncode}: {done.stderr.strip()[:120]}")


def _capabilities() -> str:
    status = Path("/proc/self/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    held = {k: fields[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    if fields.get("NoNewPrivs", "0").strip() != "1":
        return "no_new_privs is not set"
    if any(int(v, 16) for v in held.values()):
        return f"capabilities held: {held}"
    raise PermissionError(f"no capability held, no_new_privs set ({held})")


def _descriptors() -> str:
    outside = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("pipe:", "socket:", "anon_inode:", "/dev/null", "/proc/")):
            continue
        outside.append(f"{fd}->{target}")
    if outside:
        return ", ".join(outside)
    raise PermissionError("only pipes, /dev/null and /proc")


def _credentials() -> str:
    allowed = {
        "GPUFLEET_JOB_SPEC",
        "GPUFLEET_JOB_DIR",
        "GPUFLEET_PIPELINE_DIR",
        "GPUFLEET_CLOCK",
        "GPUFLEET_CLOCK_SPEED",
        "GPUFLEET_CLOCK_ORIGIN",
        "GPUFLEET_CLOCK_FILE",
        "GPUFLEET_MODEL_GATEWAY_SOCKET",
        "GPUFLEET_VOICE_SERVICE_SOCKET",
    }
    leaked = [
        k
        for k in os.environ
        if (k.startswith("GPUFLEET_") and k not in allowed)
        or k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "OTEL_"))
    ]
    leaked += [k for k, v in os.environ.items() if "sekrit" in v]
    if leaked:
        return ", ".join(sorted(set(leaked)))
    raise PermissionError(f"environment holds only {sorted(os.environ)}")


def _hostname(host: str) -> str:
    mine = socket.gethostname()
    if mine == host:
        return mine
    raise PermissionError(f"its own hostname {mine!r}")


def _replace_job_dir() -> str:
    os.rmdir("/job")  # a mount point: EBUSY
    os.symlink("/etc", "/job")
    return "replaced"


def forkbomb() -> int:
    children = 0
    try:
        while children < 100_000:
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
    except OSError as err:
        report("fork without limit", False, f"stopped after {children} children: {err}")
        return 0
    report("fork without limit", True, f"{children} children")
    return 0


def balloon() -> int:
    chunks = []
    for megabytes in range(1, 100_000):
        chunks.append(bytearray(1 << 20))
        if megabytes % 64 == 0:
            print(json.dumps({"balloon_mb": megabytes}), flush=True)
    report("allocate without limit", True, "100 GB allocated")
    return 0


def daemon() -> int:
    """Leave processes behind every way a job might: double fork + setsid, nohup, a group."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            time.sleep(1000)
            os._exit(0)
        os._exit(0)
    subprocess.Popen(
        ["nohup", "sleep", "1001"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    subprocess.Popen(["sleep", "1002"], process_group=0)
    time.sleep(0.5)
    print(json.dumps({"daemons": "started"}), flush=True)
    return 0


def egress() -> int:
    """A kind that runs only the platform's code: out through the filtering proxy only."""
    proxy = os.environ.get("HTTPS_PROXY", "")
    report("egress proxy offered", not proxy, proxy or "no HTTPS_PROXY")  # crossed = missing
    for host, port in PARAMS["refused"]:
        attempt(f"CONNECT {host}:{port} through the proxy", lambda h=host, p=port: _connect_via_proxy(h, p))
    allowed = PARAMS.get("allowed")
    if allowed:
        try:
            body = _get_via_proxy(*allowed)
            print(json.dumps({"allowed": body[:60]}), flush=True)
        except Exception as err:
            print(json.dumps({"allowed_error": str(err)}), flush=True)
        attempt(
            f"reach {allowed[0]} directly, not through the proxy", lambda: connect_tcp(allowed[0], allowed[1])
        )
    attempt("connect to the cloud metadata service directly", lambda: connect_tcp("169.254.169.254", 80))
    return 0


def _proxy_socket() -> socket.socket:
    host, port = os.environ["HTTPS_PROXY"].removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _connect_via_proxy(host: str, port: int) -> str:
    with _proxy_socket() as s:
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        answer = s.recv(4096).decode(errors="replace")
    if answer.startswith("HTTP/1.1 200"):
        return answer.splitlines()[0]
    raise PermissionError(answer.splitlines()[0] if answer else "closed")


def _get_via_proxy(host: str, port: int) -> str:
    with _proxy_socket() as s:
        s.sendall(f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode(errors="replace")


def echo() -> int:
    print("tenant_values " + json.dumps(VALUES, sort_keys=True), flush=True)
    return 0


ROLES = {
    "victim": victim,
    "prober": prober,
    "forkbomb": forkbomb,
    "balloon": balloon,
    "daemon": daemon,
    "egress": egress,
    "echo": echo,
}

if __name__ == "__main__":
    del errno
    sys.exit(ROLES[VALUES["role"]]())
