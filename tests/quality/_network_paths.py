"""The network paths the authorization table allows, and the ones the rendered
NetworkPolicies open, in one vocabulary so that the two sets can be compared.

A path is (from, to, protocol/port). An end is a role — a part of this deployment selected
by its pod label, or one outside it (backend, operator, gateway, machine, collector,
metrics, database) selected the same way in any namespace — or `dns`, or `cidr:<range>` for
an address range no role names. An address range in the same rule as exactly one role is
that role's network (the machines' subnets, the managed database's range).

The table says who may call which method; the code says which part serves which gRPC
service (its `add_<Service>Servicer_to_server`); the agent serves on its machine, so a path
to it is a path to `machine`. Health and reflection are answered to any identity on every
server: they give no one a reason to reach a part, so they open no path of their own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.common.trust.authz import HEALTH_METHODS
from gpufleet.common.trust.identity import Role
from tests.quality._kubernetes import ROLE_LABEL, Doc, Workload, selects, workloads
from tests.quality._repo import REPO, SERVICES

Path_ = tuple[str, str, str]  # (from, to, "TCP/50051")
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
DNS = "dns"


def served_by() -> dict[str, str]:
    """gRPC service name -> the part that serves it, read from the parts' own code."""
    found: dict[str, str] = {}
    for part in SERVICES:
        for source in (REPO / "services" / part / "gpufleet" / part).rglob("*.py"):
            for name in re.findall(r"add_(\w+)Servicer_to_server", source.read_text()):
                found[name] = part
    return found


def endpoint_of_part(part: str) -> str:
    """Where a part is reached: the agent on its machine, every other part as itself."""
    return Role.MACHINE.value if part == "agent" else part


def table_paths(rules: Mapping[str, frozenset[Role]], ports: Mapping[str, set[int]]) -> set[Path_]:
    """Every (caller, part, port) that some rule of the table lets a role call.
    ``ports``: end -> the ports it serves the API on (from the parts' settings)."""
    serving = served_by()
    paths: set[Path_] = set()
    for method, roles in rules.items():
        if method in HEALTH_METHODS or method == REFLECTION:
            continue
        service = method.split("/")[1].rsplit(".", 1)[1]
        assert service in serving, f"{service} ({method}) is served by no part"
        end = endpoint_of_part(serving[service])
        for role in roles:
            for port in ports[end]:
                paths.add((role.value, end, f"TCP/{port}"))
    return paths


@dataclass(frozen=True)
class Opened:
    """The paths the policies open, on each side: ingress into our pods, egress out of them."""

    ingress: frozenset[Path_]
    egress: frozenset[Path_]
    problems: tuple[str, ...]


def _peer_role(peer: Doc) -> str | None:
    pods = peer.get("podSelector")
    namespaces = peer.get("namespaceSelector")
    if pods is None:
        return None
    labels = pods.get("matchLabels") or {}
    if set(pods) - {"matchLabels"} or len(labels) != 1:
        return None
    if labels.get("k8s-app") == "kube-dns" and (namespaces or {}).get("matchLabels") == {
        "kubernetes.io/metadata.name": "kube-system"
    }:
        return DNS
    if ROLE_LABEL in labels and namespaces in (None, {}):
        return str(labels[ROLE_LABEL])
    return None


def _ends(peers: list[Doc] | None) -> set[str]:
    """The ends a rule's peers name (no peers at all: anywhere)."""
    if not peers:
        return {"anywhere"}
    roles = {r for r in (_peer_role(p) for p in peers) if r is not None}
    ends = set(roles)
    for peer in peers:
        if _peer_role(peer) is not None:
            continue
        if set(peer) == {"ipBlock"} and len(roles - {DNS}) == 1:
            continue  # that one role's network
        if set(peer) == {"ipBlock"}:
            block = peer["ipBlock"]
            ends.add(f"cidr:{block['cidr']}" + (f" except {block['except']}" if block.get("except") else ""))
        else:
            ends.add("peer:" + json.dumps(peer, sort_keys=True))
    return ends


def _ports(rule: Doc) -> set[str]:
    ports = rule.get("ports")
    if not ports:
        return {"*"}
    return {
        f"{p.get('protocol', 'TCP')}/{p.get('port', '*')}" + (f"-{p['endPort']}" if "endPort" in p else "")
        for p in ports
    }


def _types(policy: Doc) -> set[str]:
    spec = policy["spec"]
    given = spec.get("policyTypes")
    if given:
        return set(given)
    return {"Ingress"} | ({"Egress"} if "egress" in spec else set())


def opened(docs: list[Doc]) -> Opened:
    """What the rendered policies open, for the pods of this namespace's workloads; and a
    problem for a workload that no policy denies by default in both directions."""
    pods = workloads(docs)
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    ingress: set[Path_] = set()
    egress: set[Path_] = set()
    problems: list[str] = []
    for workload in pods:
        mine = [p for p in policies if selects(p["spec"].get("podSelector"), workload.labels)]
        for direction in ("Ingress", "Egress"):
            if not any(direction in _types(p) for p in mine):
                problems.append(f"{workload}: no network policy restricts its {direction.lower()}")
        if not any(_is_default_deny(p) for p in mine):
            problems.append(f"{workload}: no default-deny policy selects it")
        for policy in mine:
            types = _types(policy)
            if "Ingress" in types:
                for rule in policy["spec"].get("ingress") or []:
                    for end in _ends(rule.get("from")):
                        ingress |= {(end, _role(workload), port) for port in _ports(rule)}
            if "Egress" in types:
                for rule in policy["spec"].get("egress") or []:
                    for end in _ends(rule.get("to")):
                        egress |= {(_role(workload), end, port) for port in _ports(rule)}
    return Opened(frozenset(ingress), frozenset(egress), tuple(problems))


def _is_default_deny(policy: Doc) -> bool:
    spec = policy["spec"]
    return (
        spec.get("podSelector") in ({}, None)
        and _types(policy) == {"Ingress", "Egress"}
        and not spec.get("ingress")
        and not spec.get("egress")
    )


def _role(workload: Workload) -> str:
    return workload.role or f"unlabelled:{workload}"


def expected(
    docs: list[Doc], table: set[Path_], infrastructure: set[Path_]
) -> tuple[frozenset[Path_], frozenset[Path_]]:
    """Which side of each path the policies must open: ingress where it ends at a pod of
    this namespace, egress where it starts at one."""
    here = {_role(w) for w in workloads(docs)}
    paths = table | infrastructure
    return (
        frozenset(p for p in paths if p[1] in here),
        frozenset(p for p in paths if p[0] in here),
    )


def differences(want: tuple[frozenset[Path_], frozenset[Path_]], got: Opened) -> list[str]:
    """What the policies open that nothing allows, and what is allowed that they close."""
    lines: list[str] = list(got.problems)
    for side, w, g in (("ingress", want[0], got.ingress), ("egress", want[1], got.egress)):
        lines += [f"{side} opened, allowed by nothing: {a} -> {b} {port}" for a, b, port in sorted(g - w)]
        lines += [f"{side} allowed, not opened: {a} -> {b} {port}" for a, b, port in sorted(w - g)]
    return lines
