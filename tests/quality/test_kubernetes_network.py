"""The network policies of deploy/kubernetes against the authorization table: the paths the
table allows (a role may call a method some part serves, on the port that part's settings
listen on) plus the infrastructure every part needs (DNS, the collector, Prometheus, the
database for the parts with database access, the clouds for the provisioner alone) are
exactly the paths the rendered policies open — nothing more, nothing less, each on the side
of the pods of this namespace. Shown to fail on a changed table and on broken policies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gpufleet.common.trust.authz import RULES
from gpufleet.common.trust.identity import Role
from tests.quality._kubernetes import (
    BUCKET,
    BUCKET_VALUES,
    COMPONENTS,
    KUSTOMIZE,
    OVERLAYS,
    PARTS,
    Doc,
    of_kind,
    port_of,
    render,
    render_with_components,
    workload_of,
)
from tests.quality._kubernetes_checks import main_reader
from tests.quality._network_paths import (
    DNS,
    Path_,
    differences,
    expected,
    opened,
    served_by,
    table_paths,
)

# The provisioner's way to the clouds: their APIs over HTTPS, and the node's metadata
# server (GKE's workload identity, EC2's instance role). No other part has either.
CLOUDS = {("cidr:0.0.0.0/0", "TCP/443"), ("cidr:::/0", "TCP/443"), ("cidr:169.254.169.254/32", "TCP/80")}
OTLP_DEFAULT_PORT = 4317


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {overlay: render(KUSTOMIZE / "overlays" / overlay) for overlay in OVERLAYS}


def settings_of(docs: list[Doc]) -> dict[str, dict[str, Any]]:
    found = {}
    for part in PARTS:
        reader = main_reader(docs, workload_of(docs, part))
        assert reader is not None and reader.settings is not None
        found[part] = reader.settings
    return found


def api_ports(settings: dict[str, dict[str, Any]]) -> dict[str, set[int]]:
    """Where each end serves the API: a part's listen address; a machine's agent on the
    port the provisioner gives the machines it creates."""
    ports = {part: {port_of(s["listen_address"])} for part, s in settings.items()}
    provisioner = settings["provisioner"]
    ports[Role.MACHINE.value] = {provisioner["gcp_agent_port"], provisioner["aws_agent_port"]}
    return ports


def infrastructure(settings: dict[str, dict[str, Any]]) -> set[Path_]:
    paths: set[Path_] = set()
    for part, s in settings.items():
        paths |= {(part, DNS, "UDP/53"), (part, DNS, "TCP/53")}
        otlp = urlsplit(s["otlp_endpoint"]).port if s.get("otlp_endpoint") else None
        paths.add((part, "collector", f"TCP/{otlp or OTLP_DEFAULT_PORT}"))
        paths.add(("metrics", part, f"TCP/{port_of(s['metrics_address'])}"))
        if "database_url" in s:
            paths.add((part, "database", f"TCP/{urlsplit(s['database_url']).port or 5432}"))
    paths |= {("provisioner", end, port) for end, port in CLOUDS}
    return paths


def problems_of(docs: list[Doc], rules: Any = RULES) -> list[str]:
    settings = settings_of(docs)
    want = expected(docs, table_paths(rules, api_ports(settings)), infrastructure(settings))
    return differences(want, opened(docs))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_policies_open_exactly_what_the_table_allows(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    assert problems_of(rendered[overlay]) == []


def test_the_table_s_paths_are_the_ones_the_design_draws(rendered: dict[str, list[Doc]]) -> None:
    # What the derivation reads from the table and the code, spelled out once: the backend
    # and operators to the scheduler's API, operators to the reaper's and the sweeper's,
    # the gateway to TokenService, machines to WorkerService, the deciders to the
    # provisioner, the scheduler and the reaper to the agents.
    assert served_by()["WorkerService"] == "scheduler"
    assert served_by()["AgentService"] == "agent"
    paths = table_paths(RULES, api_ports(settings_of(rendered["production"])))
    assert paths == {
        ("backend", "scheduler", "TCP/50051"),
        ("operator", "scheduler", "TCP/50051"),
        ("gateway", "scheduler", "TCP/50051"),
        ("machine", "scheduler", "TCP/50051"),
        ("operator", "reaper", "TCP/50052"),
        ("operator", "sweeper", "TCP/50054"),
        ("scheduler", "provisioner", "TCP/50053"),
        ("reaper", "provisioner", "TCP/50053"),
        ("sweeper", "provisioner", "TCP/50053"),
        ("scheduler", "machine", "TCP/50060"),
        ("reaper", "machine", "TCP/50060"),
    }


def test_a_change_to_the_table_is_a_path_the_policies_lack(rendered: dict[str, list[Doc]]) -> None:
    rules = dict(RULES)
    rules["/gpufleet.v1.ReaperService/ListIncidents"] = frozenset({Role.OPERATOR, Role.BACKEND})
    assert problems_of(rendered["production"], rules) == [
        "ingress allowed, not opened: backend -> reaper TCP/50052"
    ]
    rules = dict(RULES)
    for method in [m for m in rules if "/gpufleet.v1.SweeperService/" in m]:
        rules[method] = frozenset({Role.OPERATOR, Role.SCHEDULER})
    assert problems_of(rendered["production"], rules) == [
        "ingress allowed, not opened: scheduler -> sweeper TCP/50054",
        "egress allowed, not opened: scheduler -> sweeper TCP/50054",
    ]


def _policy(docs: list[Doc], name: str) -> Doc:
    spec: Doc = of_kind(docs, "NetworkPolicy")[name]["spec"]
    return spec


def _from(role: str) -> Doc:
    return {"namespaceSelector": {}, "podSelector": {"matchLabels": {"gpufleet.dev/role": role}}}


@pytest.mark.parametrize(
    ("mutate", "problems"),
    [
        pytest.param(
            lambda docs: _policy(docs, "gpufleet-provisioner")["ingress"][0]["from"].append(_from("backend")),
            ["ingress opened, allowed by nothing: backend -> provisioner TCP/50053"],
            id="backend-to-the-provisioner",
        ),
        pytest.param(
            lambda docs: _policy(docs, "gpufleet-scheduler")["ingress"].pop(1),
            ["ingress allowed, not opened: machine -> scheduler TCP/50051"],
            id="machines-cut-off",
        ),
        pytest.param(
            lambda docs: _policy(docs, "gpufleet-reaper")["egress"].append(
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]}
            ),
            ["egress opened, allowed by nothing: reaper -> cidr:0.0.0.0/0 TCP/443"],
            id="the-reaper-reaches-a-cloud",
        ),
        pytest.param(
            lambda docs: _policy(docs, "gpufleet-sweeper")["ingress"][0].pop("ports"),
            [
                "ingress opened, allowed by nothing: operator -> sweeper *",
                "ingress allowed, not opened: operator -> sweeper TCP/50054",
            ],
            id="every-port",
        ),
        pytest.param(
            lambda docs: _policy(docs, "gpufleet-sweeper")["egress"][0].pop("to"),
            [
                "egress opened, allowed by nothing: sweeper -> anywhere TCP/50053",
                "egress allowed, not opened: sweeper -> provisioner TCP/50053",
            ],
            id="anywhere",
        ),
        pytest.param(
            lambda docs: docs.remove(of_kind(docs, "NetworkPolicy")["gpufleet-default-deny"]),
            [f"Deployment/gpufleet-{p}: no default-deny policy selects it" for p in sorted(PARTS)],
            id="no-default-deny",
        ),
    ],
)
def test_the_comparison_rejects_broken_policies(
    rendered: dict[str, list[Doc]], mutate: Callable[[list[Doc]], None], problems: list[str]
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(docs)
    assert problems_of(docs) == problems


def test_the_incident_webhook_component_opens_the_reaper_s_way_out_and_nothing_else(
    rendered: dict[str, list[Doc]], tmp_path: Path
) -> None:
    docs = render_with_components(tmp_path, "production", COMPONENTS)
    assert problems_of(docs) == [
        "egress opened, allowed by nothing: reaper -> alertmanager TCP/9093",
        "egress opened, allowed by nothing: reaper -> cidr:0.0.0.0/0 TCP/443",
        "egress opened, allowed by nothing: reaper -> cidr:::/0 TCP/443",
    ]


def test_a_checkpoint_bucket_opens_the_scheduler_s_way_to_its_storage_and_nothing_else(
    tmp_path: Path,
) -> None:
    docs = render_with_components(tmp_path, "production", (BUCKET,), BUCKET_VALUES)
    assert problems_of(docs) == [
        "egress opened, allowed by nothing: scheduler -> cidr:0.0.0.0/0 TCP/443",
        "egress opened, allowed by nothing: scheduler -> cidr:169.254.169.254/32 TCP/80",
        "egress opened, allowed by nothing: scheduler -> cidr:::/0 TCP/443",
    ]
