"""*Watchdogs & ledger*: what each net did and refused, how late it caught what it caught,
whether every watchdog is still running and every timer service has a leader, the orphan
sweep, the failure ledger and its incidents, and how the clouds answer.

The panels that count spans' work link to Jaeger: a net's pass is the span
``reaper.<net>.tick`` of gpufleet-reaper (each refusal is an event on it), a provider call
the span ``provider.<operation>`` of gpufleet-provisioner (its ``gpufleet.provider`` and,
on failure, ``gpufleet.provider_error`` attributes are the series' labels).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink

from deploy.grafana import panels as p
from gpufleet.common.metrics import catalog as m

UID = "gpufleet-watchdogs-ledger"

REAPER = "gpufleet-reaper"
PROVISIONER = "gpufleet-provisioner"


def _net_pass() -> DashboardLink:
    return p.jaeger_search("This net's passes in Jaeger", REAPER, f"reaper.{p.label('net')}.tick")


def _provider_calls(title: str, failed: bool) -> DashboardLink:
    tags = [("gpufleet.provider", p.label("provider"))]
    if failed:
        tags.append(("gpufleet.provider_error", p.label("result")))
    return p.jaeger_search(title, PROVISIONER, f"provider.{p.label('operation')}", tags)


def dashboard() -> Dashboard:
    last_run = m.WATCHDOG_LAST_RUN.prometheus_name
    cadence = m.WATCHDOG_CADENCE.prometheus_name
    silence = f"time() - max by (net) ({last_run})"
    return (
        p.new_dashboard(
            "gpufleet / Watchdogs & ledger",
            UID,
            "Each net's actions and refusals, detection latency, watchdog silence, leaders, "
            "orphans, the failure ledger, incidents, quarantines, and the clouds' answers "
            "(metrics: docs/metrics.md; alerts: deploy/prometheus/alerts.yml).",
        )
        .with_row(p.row("Now"))
        .with_panel(
            p.single(
                "Incidents open",
                "Incidents not resolved (acknowledged ones included): a human must act on "
                "each (`gpufleet incidents`).",
                p.instant(p.gauge(m.INCIDENTS_OPEN)),
                colours=p.thresholds((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            p.single(
                "Quarantines in force",
                "Offerings the scheduler will not create and provider regions halted.",
                p.instant(p.gauge(m.QUARANTINES_ACTIVE)),
                colours=p.thresholds((None, "green"), (1, "orange")),
            )
        )
        .with_panel(
            p.single(
                "Longest watchdog silence, in cadences",
                "The watchdog that has gone longest without a pass, in units of its own "
                "cadence: an alert fires past 3.",
                p.instant(f"max(({silence}) / max by (net) ({cadence}))"),
                colours=p.thresholds((None, "green"), (2, "orange"), (3, "red")),
                decimals=1,
            )
        )
        .with_panel(
            p.single(
                "Leases without a leader",
                "Timer services (scheduler, reaper, sweeper) whose lease no process holds.",
                p.instant(f"count(sum by (lease) ({m.LEADER_LEADING.prometheus_name}) == 0) or vector(0)"),
                colours=p.thresholds((None, "green"), (1, "red")),
            )
        )
        .with_row(p.row("Nets"))
        .with_panel(
            p.graph(
                "Actions by net",
                "What the reaper's nets did, per minute, by net and action. Click a line for "
                "that net's passes in Jaeger.",
                [p.query(p.per_minute(m.REAPER_ACTIONS, ["net", "action"]), "{{net}} {{action}}")],
                unit="opm",
                stacked=True,
                links=[_net_pass()],
            )
        )
        .with_panel(
            p.graph(
                "Refusals by net and gate",
                "Times a net looked at a machine and did not act, per minute, by the gate that "
                "said no; each refusal is an event on the net's pass span (click a line).",
                [p.query(p.per_minute(m.REAPER_REFUSALS, ["net", "gate"]), "{{net}} {{gate}}")],
                unit="opm",
                stacked=True,
                links=[_net_pass()],
            )
        )
        .with_panel(
            p.graph(
                "Detection latency by net",
                "From a failure's first sign (last heartbeat, the deadline's start, idle "
                "since, the transition's start) to the net's act: p50 and p95.",
                p.quantile_queries(m.REAPER_DETECTION_LATENCY, ["net"], quantiles=(0.5, 0.95)),
                unit="s",
                links=[_net_pass()],
            )
        )
        .with_panel(
            p.graph(
                "Idle timers armed and cleared",
                "The idle chain's timers per minute: armed when a machine is first seen idle, "
                "cleared when it is busy again before a stop.",
                [p.query(p.per_minute(m.REAPER_IDLE_TIMERS, ["action"]), "{{action}}")],
                unit="opm",
            )
        )
        .with_panel(
            p.graph(
                "GPU findings",
                "GPU health findings the machines reported for the first time, per minute, by "
                "severity and kind (an Xid, ECC, a row remap, a lost GPU, a failed "
                "initialisation): a critical one cordons its machine and the gpu_fault net "
                "destroys it; a warning is only counted.",
                [p.query(p.per_minute(m.GPU_FINDINGS, ["severity", "finding"]), "{{severity}} {{finding}}")],
                unit="opm",
                stacked=True,
                width=p.FULL,
            )
        )
        .with_panel(
            p.graph(
                "Watchdog silence",
                "Seconds since each watchdog (a reaper net, the sweeper's passes, the "
                "scheduler's request watchdogs) last completed a pass.",
                [p.query(silence, "{{net}}")],
                unit="s",
            )
        )
        .with_panel(
            p.graph(
                "Watchdog silence in cadences",
                "The same silence over each watchdog's own cadence: the dashed line at 3 is "
                "where the alert fires.",
                [p.query(f"({silence}) / max by (net) ({cadence})", "{{net}}")],
                limit=p.thresholds((None, "transparent"), (3, "red")),
            )
        )
        .with_panel(
            p.graph(
                "Leaders by lease",
                "Processes holding each timer service's lease: 1 is healthy, 0 means no "
                "leader (its timers are not running).",
                [p.query(p.gauge(m.LEADER_LEADING, ["lease"]), "{{lease}}")],
                limit=p.thresholds((None, "red"), (1, "transparent"), (2, "red")),
                width=p.FULL,
            )
        )
        .with_row(p.row("Sweeper"))
        .with_panel(
            p.graph(
                "Orphans by provider and outcome",
                "Cloud instances with gpufleet's tag and no live machine, in the trailing hour: "
                "found, destroyed, or refused by a gate (too young to be sure).",
                [
                    p.query(
                        p.trailing_hour(m.SWEEPER_ORPHANS, ["provider", "outcome"]),
                        "{{provider}} {{outcome}}",
                    )
                ],
            )
        )
        .with_panel(
            p.graph(
                "Provider listing failures",
                "Consecutive failed listings of each provider's instances: while above 0 "
                "neither orphans nor lost instances are found there.",
                [
                    p.query(
                        f"max by (provider) ({m.SWEEPER_LISTING_FAILURES.prometheus_name})", "{{provider}}"
                    )
                ],
                limit=p.thresholds((None, "transparent"), (1, "red")),
            )
        )
        .with_row(p.row("Ledger & incidents"))
        .with_panel(
            p.graph(
                "Ledger rows by class and outcome",
                "Rows written to the failure ledger in the trailing hour, by failure class and "
                "the outcome it routed to (ALERT_HUMAN opens an incident).",
                [
                    p.query(
                        p.trailing_hour(m.LEDGER_FAILURES, ["failure_class", "outcome"]),
                        "{{failure_class}} {{outcome}}",
                    )
                ],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Incidents open by failure class",
                "Incidents not resolved, by failure class.",
                [p.query(p.gauge(m.INCIDENTS_OPEN, ["failure_class"]), "{{failure_class}}")],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Quarantines in force",
                "Offerings quarantined and provider regions halted, by provider.",
                [
                    p.query(
                        p.gauge(m.QUARANTINES_ACTIVE, ["quarantine_kind", "provider"]),
                        "{{provider}} {{quarantine_kind}}",
                    )
                ],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Incident notifications by outcome",
                "Incident webhook posts in the trailing hour: sent, failed (retries spent), "
                "dropped (the queue was full).",
                [p.query(p.trailing_hour(m.INCIDENT_NOTIFICATIONS, ["outcome"]), "{{outcome}}")],
            )
        )
        .with_row(p.row("Clouds"))
        .with_panel(
            p.graph(
                "Provider calls",
                "Calls to the clouds' APIs per minute, by provider, operation and result. "
                "Click a line for those calls in Jaeger.",
                [
                    p.query(
                        p.per_minute(m.PROVIDER_CALLS, ["provider", "operation", "result"]),
                        "{{provider}} {{operation}} {{result}}",
                    )
                ],
                unit="opm",
                stacked=True,
                links=[_provider_calls("These calls in Jaeger", failed=False)],
            )
        )
        .with_panel(
            p.graph(
                "Provider errors",
                "Calls that failed per minute, by the typed error (INSUFFICIENT_CAPACITY: a "
                "stockout; AUTH_FAILED: lost credentials). Click a line for the failed calls.",
                [
                    p.query(
                        p.per_minute(m.PROVIDER_CALLS, ["provider", "operation", "result"], 'result!="OK"'),
                        "{{provider}} {{operation}} {{result}}",
                    )
                ],
                unit="opm",
                stacked=True,
                links=[_provider_calls("These failed calls in Jaeger", failed=True)],
            )
        )
        .with_panel(
            p.graph(
                "Provider call latency",
                "p95 of each call's duration, failed ones included (a create counts its wait "
                "for the instance), by provider and operation.",
                p.quantile_queries(m.PROVIDER_CALL_DURATION, ["provider", "operation"], quantiles=(0.95,)),
                unit="s",
                links=[_provider_calls("These calls in Jaeger", failed=False)],
            )
        )
        .with_panel(
            p.graph(
                "Stockouts",
                "Creates a cloud refused for want of capacity, in the trailing hour, by "
                "provider, region and offering.",
                [
                    p.query(
                        p.trailing_hour(m.PROVIDER_STOCKOUTS, ["provider", "region", "offering"]),
                        "{{provider}} {{region}} {{offering}}",
                    )
                ],
                stacked=True,
                links=[
                    p.jaeger_search(
                        "Refused creates in Jaeger",
                        PROVISIONER,
                        "provider.create",
                        [
                            ("gpufleet.provider", p.label("provider")),
                            ("gpufleet.provider_error", "INSUFFICIENT_CAPACITY"),
                        ],
                    )
                ],
            )
        )
    )
