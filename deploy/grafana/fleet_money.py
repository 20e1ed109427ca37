"""*Fleet & money*: what the fleet costs and how much of it does nothing.

The GPU counters are GPU-seconds (the catalogue keeps base units): every figure here divides
by 3600 to show GPU-hours. Every gauge comes from the scheduler leader's last fleet tick and
is summed across replicas, as the catalogue says (a deposed leader stops reporting within
three ticks).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from deploy.grafana import panels as p
from gpufleet.common.metrics import catalog as m

UID = "gpufleet-fleet-money"

BILLED = m.FLEET_GPU_BILLED.prometheus_name
IDLE = m.FLEET_GPU_IDLE.prometheus_name


def dashboard() -> Dashboard:
    return (
        p.new_dashboard(
            "gpufleet / Fleet & money",
            UID,
            "GPU-hours billed and idle, spend rate, machines by state, slots, films' machines and "
            "warm pools (metrics: docs/metrics.md).",
        )
        .with_row(p.row("Money"))
        .with_panel(
            p.single(
                "GPU-hours billed",
                "GPU-hours the clouds billed over the dashboard's time range (every billing "
                "state but STOPPED), all providers and pools.",
                p.instant(f"sum(increase({BILLED}[$__range])) / 3600"),
                unit="h",
                decimals=1,
            )
        )
        .with_panel(
            p.single(
                "GPU-hours idle",
                "The part of the billed GPU-hours on machines with no live attempt, over the "
                "dashboard's time range: the waste the nets exist to bound.",
                p.instant(f"sum(increase({IDLE}[$__range])) / 3600"),
                unit="h",
                decimals=1,
            )
        )
        .with_panel(
            p.single(
                "Idle share of billed",
                "Idle GPU-hours over billed GPU-hours, over the dashboard's time range.",
                p.instant(f"sum(increase({IDLE}[$__range])) / sum(increase({BILLED}[$__range]))"),
                unit="percentunit",
                colours=p.thresholds((None, "green"), (0.2, "orange"), (0.5, "red")),
                decimals=1,
            )
        )
        .with_panel(
            p.single(
                "Spend rate now",
                "What the machines billing now cost per hour (USD), at their offerings' catalogue prices.",
                p.instant(p.gauge(m.FLEET_SPEND_RATE)),
                unit="currencyUSD",
                decimals=2,
            )
        )
        .with_panel(
            p.graph(
                "GPU-hours billed vs idle, trailing hour",
                "GPU-hours billed and idle in the hour before each point: the gap between the "
                "lines is GPU time that ran or waited for work.",
                [
                    p.query(f"sum(increase({BILLED}[1h])) / 3600", "billed", "A"),
                    p.query(f"sum(increase({IDLE}[1h])) / 3600", "idle", "B"),
                ],
                unit="h",
            )
        )
        .with_panel(
            p.graph(
                "Idle share of billed by pool, trailing hour",
                "Per pool, idle GPU-hours over billed GPU-hours in the hour before each point.",
                [
                    p.query(
                        f"sum by (pool) (increase({IDLE}[1h])) / sum by (pool) (increase({BILLED}[1h]))",
                        "{{pool}}",
                    )
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            p.graph(
                "GPUs billing by provider and pool",
                "GPU-seconds billed per second: the number of GPUs being paid for, averaged "
                "over each interval (GPU-hours per hour).",
                [
                    p.query(
                        f"sum by (provider, pool) (rate({BILLED}[$__rate_interval]))", "{{provider}} {{pool}}"
                    )
                ],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Spend rate by provider",
                "USD per hour the billing machines cost, by provider, at catalogue prices.",
                [p.query(p.gauge(m.FLEET_SPEND_RATE, ["provider"]), "{{provider}}")],
                unit="currencyUSD",
                stacked=True,
            )
        )
        .with_row(p.row("Machines"))
        .with_panel(
            p.graph(
                "Machines by state",
                "Machines not destroyed, by state. Machines that stay in STOPPING or "
                "DESTROYING fire an alert (deploy/prometheus/alerts.yml).",
                [p.query(p.gauge(m.FLEET_MACHINES, ["state"]), "{{state}}")],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Machines by provider and pool",
                "Machines not destroyed, by provider and pool.",
                [p.query(p.gauge(m.FLEET_MACHINES, ["provider", "pool"]), "{{provider}} {{pool}}")],
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Slots free and busy by pool",
                "Slots of READY machines: busy ones hold a live attempt. Free slots on billing "
                "machines with a queue waiting mean the scheduler is not placing work.",
                [p.query(p.gauge(m.FLEET_SLOTS, ["pool", "slot_state"]), "{{pool}} {{slot_state}}")],
                stacked=True,
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "Films' machines: earmarked and draining",
                "Machines held for films: earmarked for a film's next job, or draining (taking "
                "no new work) for one, by pool.",
                [
                    p.query(
                        p.gauge(m.FLEET_FILM_MACHINES, ["pool", "film_state"]),
                        "{{pool}} {{film_state}}",
                    )
                ],
                stacked=True,
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "Warm machines held by pool",
                "Machines each pool keeps warm (pinned against auto-stop and auto-destroy): "
                "billed whether or not they run anything.",
                [p.query(p.gauge(m.FLEET_WARM_MACHINES, ["pool"]), "{{pool}}")],
                stacked=True,
                width=p.THIRD,
            )
        )
    )
