"""The walls' pure decisions, from tables: the sandbox's command line, the egress filter,
the cgroup layout, GPU nodes per slot — and the wipe and pipeline install on real folders."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from gpufleet.agent.walls import devices, network, pipelines, sandbox, wipe
from gpufleet.agent.walls.cgroups import CgroupError, detect_layout, parse_mounts, parse_own_cgroups

PLAN = sandbox.SandboxPlan(
    uid=1234,
    gid=1234,
    job_dir=Path("/w/jobs/a-1"),
    home=Path("/w/homes/0"),
    run_dir=Path("/w/run/a-1"),
    pipeline_dir=Path("/w/pipelines/v1"),
    devices=("/dev/nvidia0", "/dev/nvidiactl"),
    present=frozenset({"/usr", "/etc", "/lib"}),
)


def test_the_sandbox_drops_root_before_bubblewrap_and_builds_every_wall() -> None:
    argv = sandbox.bwrap_argv(PLAN)
    setpriv, bwrap = argv[: argv.index("bwrap")], argv[argv.index("bwrap") :]
    assert setpriv[:3] == ["setpriv", "--reuid=1234", "--regid=1234"]
    assert {"--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"} <= set(setpriv)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"):
        assert flag in bwrap
    assert {"--disable-userns", "--die-with-parent", "--new-session"} <= set(bwrap)
    pairs = list(zip(bwrap, bwrap[1:], bwrap[2:], strict=False))
    assert ("--ro-bind", "/usr", "/usr") in pairs and ("--ro-bind", "/etc", "/etc") in pairs
    assert ("--ro-bind", "/lib64", "/lib64") not in pairs  # absent here: not bound
    assert ("--bind", "/w/jobs/a-1", "/job") in pairs
    assert ("--ro-bind", "/w/run/a-1", "/run/gpufleet") in pairs
    assert ("--ro-bind", "/w/pipelines/v1", "/opt/gpufleet/pipeline") in pairs
    assert ("--dev-bind", "/dev/nvidia0", "/dev/nvidia0") in pairs
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        assert ("--tmpfs", private) in list(itertools.pairwise(bwrap))
    assert argv[-1] == "--"


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private"),
        ("172.20.0.1", "private"),
        ("192.168.0.10", "private"),
        ("100.64.1.1", "shared"),
        ("127.0.0.53", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::1", "loopback"),
        ("fd00:ec2::254", "private"),
        ("fe80::1", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("224.0.0.1", "multicast"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("198.51.100.2", None),
    ],
)
def test_the_egress_filter_refuses_inward_addresses(address: str, refused: str | None) -> None:
    why = network.address_refusal(address, is_local=lambda _a: False)
    assert (why is None) if refused is None else (why is not None and refused in why)


def test_the_hosts_own_addresses_are_refused() -> None:
    assert "own addresses" in (network.address_refusal("8.8.8.8", is_local=lambda a: a == "8.8.8.8") or "")


@pytest.mark.parametrize(
    "name", ["metadata.google.internal", "METADATA.google.internal.", "localhost", "x.internal"]
)
def test_platform_names_are_refused_before_any_lookup(name: str) -> None:
    def resolve(_host: str, _port: int) -> list[str]:
        raise AssertionError("looked up")

    with pytest.raises(network.EgressRefused, match="platform-internal"):
        network.resolve_allowed(network.Destination(name, 80), resolve, lambda _a: False)


def test_a_name_that_also_points_inward_is_refused_whole() -> None:
    with pytest.raises(network.EgressRefused, match="private"):
        network.resolve_allowed(
            network.Destination("media.example", 443),
            lambda _h, _p: ["8.8.8.8", "10.0.0.5"],
            lambda _a: False,
        )
    assert (
        network.resolve_allowed(
            network.Destination("media.example", 443), lambda _h, _p: ["8.8.8.8"], lambda _a: False
        )
        == "8.8.8.8"
    )


def test_proxy_requests_are_parsed_into_a_destination() -> None:
    dest, first = network.parse_request_head(b"CONNECT media.example:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (dest, first) == (network.Destination("media.example", 443), b"")
    dest, first = network.parse_request_head(
        b"GET http://media.example:8080/a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert dest == network.Destination("media.example", 8080)
    assert first.startswith(b"GET /a?b=1 HTTP/1.1\r\n")
    for bad in (b"GET /relative HTTP/1.1\r\n\r\n", b"CONNECT nohost HTTP/1.1\r\n\r\n", b"\xff\r\n\r\n"):
        with pytest.raises(network.EgressRefused):
            network.parse_request_head(bad)


HYBRID_MOUNTS = """\
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
HYBRID_OWN = "4:memory:/process_api/abc\n8:pids:/\n0::/\n"


def test_a_hybrid_machine_nests_jobs_below_the_agents_own_cgroups() -> None:
    layout = detect_layout(parse_mounts(HYBRID_MOUNTS), parse_own_cgroups(HYBRID_OWN), lambda _p: "hugetlb")
    assert layout.version == 1
    assert layout.memory == Path("/sys/fs/cgroup/memory/process_api/abc/gpufleet-jobs")
    assert layout.pids == Path("/sys/fs/cgroup/pids/gpufleet-jobs")
    assert layout.kill == Path("/sys/fs/cgroup/unified/gpufleet-jobs")


def test_a_v2_machine_uses_one_cgroup_at_the_root_or_the_delegated_parent() -> None:
    mounts = parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    own = parse_own_cgroups("0::/system.slice/gpufleet-agent.service\n")
    layout = detect_layout(mounts, own, lambda _p: "cpu memory pids io")
    jobs = Path("/sys/fs/cgroup/gpufleet-jobs")
    assert (layout.version, layout.memory, layout.pids, layout.kill) == (2, jobs, jobs, jobs)
    delegated = detect_layout(mounts, own, lambda _p: "memory pids", parent="/gpufleet.slice/jobs")
    assert delegated.memory == Path("/sys/fs/cgroup/gpufleet.slice/jobs")


def test_each_machine_s_jobs_go_below_a_group_of_its_own() -> None:
    """Two agents on one host (two stacks, a stack and a test run) never make, empty or
    remove each other's jobs group; a delegated v2 parent is not the agent's to remove."""
    own = parse_own_cgroups(HYBRID_OWN)
    one = detect_layout(parse_mounts(HYBRID_MOUNTS), own, lambda _p: "hugetlb", group="gpufleet-jobs-aa-m0")
    two = detect_layout(parse_mounts(HYBRID_MOUNTS), own, lambda _p: "hugetlb", group="gpufleet-jobs-bb-m0")
    assert one.pids == Path("/sys/fs/cgroup/pids/gpufleet-jobs-aa-m0")
    assert {one.memory, one.pids, one.kill}.isdisjoint({two.memory, two.pids, two.kill})
    assert one.own_group and two.own_group
    v2 = parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    mine = detect_layout(v2, {"": "/"}, lambda _p: "memory pids", group="gpufleet-jobs-aa-m0")
    assert (mine.memory, mine.own_group) == (Path("/sys/fs/cgroup/gpufleet-jobs-aa-m0"), True)
    delegated = detect_layout(
        v2, {"": "/"}, lambda _p: "memory pids", parent="/gpufleet.slice/jobs", group="x"
    )
    assert (delegated.memory, delegated.own_group) == (Path("/sys/fs/cgroup/gpufleet.slice/jobs"), False)


def test_a_machine_without_memory_and_pids_controllers_cannot_wall_its_slots() -> None:
    with pytest.raises(CgroupError):
        detect_layout(parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"), {"": "/"}, lambda _p: "cpu io")


@pytest.mark.parametrize(
    ("gpus", "slots", "slot", "held", "chosen"),
    [
        ([], 2, 0, 1, []),
        ([0], 2, 1, 1, [0]),  # an L4: every slot time-shares GPU 0
        ([0, 1, 2, 3], 4, 2, 1, [2]),
        ([0, 1, 2, 3], 2, 1, 1, [2, 3]),
        ([0, 1], 2, 0, 2, [0, 1]),  # a film holds every slot, so every GPU
    ],
)
def test_gpus_per_slot(gpus: list[int], slots: int, slot: int, held: int, chosen: list[int]) -> None:
    assert devices.gpus_for_slots(gpus, slots, slot, held) == chosen


def test_device_nodes_include_the_control_nodes_that_exist(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert devices.gpu_nodes(tmp_path) == [0, 1]
    assert devices.device_nodes([1], tmp_path) == [
        str(tmp_path / n) for n in ("nvidia1", "nvidiactl", "nvidia-uvm")
    ]


def test_the_wipe_never_follows_a_planted_link(tmp_path: Path) -> None:
    precious = tmp_path / "etc"
    precious.mkdir()
    (precious / "passwd").write_text("root:x:0:0\n")
    home = tmp_path / "home"
    (home / "deep").mkdir(parents=True)
    (home / "link").symlink_to(precious)
    (home / "deep" / "passwd").symlink_to(precious / "passwd")
    (home / "file").write_text("x")
    wipe.empty_folder(home)
    assert list(home.iterdir()) == []
    assert (precious / "passwd").read_text() == "root:x:0:0\n"
    link_home = tmp_path / "link-home"
    link_home.symlink_to(precious)
    with pytest.raises(OSError):
        wipe.empty_folder(link_home)  # a home replaced by a link: the slot cannot be cleaned
    wipe.remove_tree(link_home)
    assert not link_home.exists() and (precious / "passwd").exists()


def test_shared_temporary_files_are_removed_by_owner(tmp_path: Path) -> None:
    (tmp_path / "mine").write_text("x")
    (tmp_path / "theirs").write_text("y")
    os.chown(tmp_path / "mine", 4321, 4321)
    assert wipe.remove_owned_entries([tmp_path], 4321) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["theirs"]


def test_a_job_keeps_the_pipeline_version_it_started_with(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "run.py").write_text("print('v1')\n")
    root = tmp_path / "pipelines"
    v1 = pipelines.install(root, "2026.11.1", source)
    (source / "run.py").write_text("print('v2')\n")
    assert pipelines.install(root, "2026.11.1", source) == v1  # installed once
    v2 = pipelines.install(root, "2026.12.0", source)
    assert (v1 / "run.py").read_text() == "print('v1')\n"
    assert (v2 / "run.py").read_text() == "print('v2')\n"
    assert oct((v1 / "run.py").stat().st_mode & 0o7777) == "0o644"  # nobody but root may change it
    with pytest.raises(pipelines.PipelineError):
        pipelines.install(root, "../etc", source)


def test_the_bundled_sample_is_installed_with_its_clock(tmp_path: Path) -> None:
    folder = pipelines.install(tmp_path, "", None)
    # Named by its content too: a gpufleet upgrade that changes the sample installs it anew.
    assert folder.name == f"default.sample-{pipelines.bundled_digest()}"
    assert {p.name for p in folder.iterdir()} == {"sample_pipeline.py", "gpufleet_clock.py"}
