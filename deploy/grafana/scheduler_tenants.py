"""*Scheduler & tenants*: how long jobs wait, by kind and plan tier, what starts and how it
ends, what dispatch costs, how the fair share divides the fleet, how close each plan tier's
workspaces are to their plan's cap on GPU jobs at once, and where the fleet tick spends its
time; then the calls between the parts and to the database, and the calls the
authorization table refused.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from deploy.grafana import panels as p
from gpufleet.common.metrics import catalog as m

UID = "gpufleet-scheduler-tenants"

SCHEDULER = "gpufleet-scheduler"
# The dispatch's call to an agent: one StartJobs per machine a tick (the gRPC client span's
# name is the method's full name).
START_JOBS = "/gpufleet.v1.AgentService/StartJobs"


def dashboard() -> Dashboard:
    tick_phase = m.SCHEDULER_TICK_PHASE_DURATION.prometheus_name
    return (
        p.new_dashboard(
            "gpufleet / Scheduler & tenants",
            UID,
            "Queue depth and wait by kind and plan tier, jobs started and finished, retries, "
            "dispatch, fair share, plan caps, the fleet tick's phases, gRPC calls and the database "
            "(metrics: docs/metrics.md).",
        )
        .with_row(p.row("Queue"))
        .with_panel(
            p.graph(
                "Jobs queued by kind and plan tier",
                "Jobs waiting for a slot (QUEUED), from the leader's last fleet tick.",
                [
                    p.query(
                        p.gauge(m.SCHEDULER_QUEUE_JOBS, ["kind", "plan_tier"]), "{{kind}} tier {{plan_tier}}"
                    )
                ],
                stacked=True,
                width=p.FULL,
            )
        )
        .with_panel(
            p.graph(
                "Queue wait by kind",
                "How long attempts that started had waited in the queue (from submission, or "
                "a retry's requeue, to RUNNING): p50, p95 and p99 by kind.",
                p.quantile_queries(m.SCHEDULER_QUEUE_WAIT, ["kind"]),
                unit="s",
            )
        )
        .with_panel(
            p.graph(
                "Queue wait by plan tier",
                "The same waits by the workspace's plan tier: a higher tier waiting longer "
                "than a lower one means the fair share or a cap is holding it back.",
                p.quantile_queries(m.SCHEDULER_QUEUE_WAIT, ["plan_tier"]),
                unit="s",
            )
        )
        .with_row(p.row("Jobs"))
        .with_panel(
            p.graph(
                "Jobs submitted by kind",
                "New jobs SubmitJob accepted, per minute (a repeated request_id is not counted).",
                [p.query(p.per_minute(m.JOBS_SUBMITTED, ["kind"]), "{{kind}}")],
                unit="opm",
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "Jobs started by kind",
                "Attempts that started on their machine (RUNNING recorded), per minute; a "
                "retried job counts once per attempt.",
                [p.query(p.per_minute(m.JOBS_STARTED, ["kind"]), "{{kind}}")],
                unit="opm",
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "Jobs finished by kind and outcome",
                "Jobs that reached a final state per minute: SUCCEEDED, FAILED, CANCELLED, TIMED_OUT.",
                [p.query(p.per_minute(m.JOBS_FINISHED, ["kind", "outcome"]), "{{kind}} {{outcome}}")],
                unit="opm",
                width=p.THIRD,
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Retries by kind and failure class",
                "Attempts whose job went back to the queue for another, in the trailing hour, "
                "by the failure that ended the attempt.",
                [
                    p.query(
                        p.trailing_hour(m.JOBS_RETRIED, ["kind", "failure_class"]),
                        "{{kind}} {{failure_class}}",
                    )
                ],
            )
        )
        .with_panel(
            p.graph(
                "Lost attempts by kind",
                "Attempts ended LOST in the trailing hour: their lease ran out or their machine "
                "was lost. Our failure, never charged to the tenant.",
                [p.query(p.trailing_hour(m.ATTEMPTS_LOST, ["kind"]), "{{kind}}")],
            )
        )
        .with_row(p.row("Dispatch"))
        .with_panel(
            p.graph(
                "Assignments by pool",
                "Jobs the fleet tick assigned to a machine's slots and committed, per minute.",
                [p.query(p.per_minute(m.SCHEDULER_ASSIGNMENTS, ["pool"]), "{{pool}}")],
                unit="opm",
                width=p.THIRD,
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Dispatch duration",
                "From an attempt's assignment commit to RUNNING recorded: p50, p95, p99. "
                "Click a line for the StartJobs calls in Jaeger.",
                p.quantile_queries(m.SCHEDULER_DISPATCH_DURATION),
                unit="s",
                width=p.THIRD,
                links=[p.jaeger_search("StartJobs calls in Jaeger", SCHEDULER, START_JOBS)],
            )
        )
        .with_panel(
            p.graph(
                "Dispatch failures by cause",
                "Attempts taken back uncharged because they could not be started, per minute: "
                "agent_refused, agent_unreachable, agent_timeout back the machine off. Click a "
                "line for the failed StartJobs calls in Jaeger.",
                [p.query(p.per_minute(m.SCHEDULER_DISPATCH_FAILURES, ["cause"]), "{{cause}}")],
                unit="opm",
                width=p.THIRD,
                stacked=True,
                links=[
                    p.jaeger_search(
                        "Failed StartJobs calls in Jaeger", SCHEDULER, START_JOBS, [("error", "true")]
                    )
                ],
            )
        )
        .with_row(p.row("Tenants"))
        .with_panel(
            p.graph(
                "Fair-share usage by plan tier",
                "Slot-hours the workspaces of each plan tier used over the fair-share window "
                "(24 h): what the fleet tick orders the queue by.",
                [
                    p.query(
                        f"{p.gauge(m.SCHEDULER_FAIR_SHARE_USAGE, ['plan_tier'])} / 3600", "tier {{plan_tier}}"
                    )
                ],
                unit="h",
                stacked=True,
                width=p.FULL,
            )
        )
        .with_row(p.row("Plan caps"))
        .with_panel(
            p.graph(
                "Jobs held by plan caps",
                "Queued jobs that could start but for their workspace's plan cap (GPU jobs at "
                "once), by plan tier: the pending reason PLAN_CONCURRENCY_LIMIT. More machines "
                "will not start these; a bigger plan would.",
                [p.query(p.gauge(m.SCHEDULER_PLAN_CAP_HELD_JOBS, ["plan_tier"]), "tier {{plan_tier}}")],
                stacked=True,
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "Workspaces at their plan's cap",
                "Workspaces running as many GPU jobs as their plan allows at once, by plan tier: "
                "the next job each submits waits for one of its own to end.",
                [
                    p.query(
                        p.gauge(m.SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP, ["plan_tier"]), "tier {{plan_tier}}"
                    )
                ],
                stacked=True,
                width=p.THIRD,
            )
        )
        .with_panel(
            p.graph(
                "GPU jobs running by plan tier",
                "Live GPU jobs (an attempt starting or running) by plan tier, as the caps count "
                "them: read beside the two panels before it, how much of a tier's use is pressed "
                "against its cap.",
                [p.query(p.gauge(m.SCHEDULER_PLAN_CAP_RUNNING_JOBS, ["plan_tier"]), "tier {{plan_tier}}")],
                stacked=True,
                width=p.THIRD,
            )
        )
        .with_row(p.row("Fleet tick"))
        .with_panel(
            p.graph(
                "Fleet tick: mean time per phase",
                "Mean wall time of each phase of the leader's fleet tick, stacked: the stack is "
                "the tick. No phase waits on a network call, so a tall one is the database or "
                "the decision. Click a phase for its spans in Jaeger.",
                [
                    p.query(
                        f"sum by (phase) (rate({tick_phase}_sum[$__rate_interval]))"
                        f" / sum by (phase) (rate({tick_phase}_count[$__rate_interval]))",
                        "{{phase}}",
                    )
                ],
                unit="s",
                stacked=True,
                links=[
                    p.jaeger_search(
                        "This phase's spans in Jaeger", SCHEDULER, f"fleet_tick.{p.label('phase')}"
                    )
                ],
            )
        )
        .with_panel(
            p.graph(
                "Fleet tick: p99 per phase",
                "The slowest ticks' phases (p99 of each phase's wall time).",
                p.quantile_queries(m.SCHEDULER_TICK_PHASE_DURATION, ["phase"], quantiles=(0.99,)),
                unit="s",
                links=[
                    p.jaeger_search(
                        "This phase's spans in Jaeger", SCHEDULER, f"fleet_tick.{p.label('phase')}"
                    )
                ],
            )
        )
        .with_row(p.row("Calls & database"))
        .with_panel(
            p.graph(
                "gRPC server latency by method",
                "p95 of each call a gpufleet server answered (SubmitJob, the agents' reports, "
                "the CLI's calls...), from its first interceptor to its status.",
                p.quantile_queries(m.RPC_SERVER_CALL_DURATION, ["rpc_method"], quantiles=(0.95,)),
                unit="s",
            )
        )
        .with_panel(
            p.graph(
                "gRPC server failures by method",
                "Calls a gpufleet server failed per minute (UNKNOWN, DEADLINE_EXCEEDED, "
                "UNAVAILABLE, INTERNAL, ...: the codes that are the server's fault), by method and code.",
                [
                    p.query(
                        p.per_minute(
                            m.RPC_SERVER_CALL_DURATION, ["rpc_method", "error_type"], 'error_type!=""'
                        ),
                        "{{rpc_method}} {{error_type}}",
                    )
                ],
                unit="opm",
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "gRPC client latency by method",
                "p95 of each call gpufleet made to another part (StartJobs to agents, creates "
                "to the provisioner...), each retry a call of its own.",
                p.quantile_queries(m.RPC_CLIENT_CALL_DURATION, ["rpc_method"], quantiles=(0.95,)),
                unit="s",
            )
        )
        .with_panel(
            p.graph(
                "gRPC client failures by method",
                "Calls gpufleet made that did not end OK, per minute, by method and code.",
                [
                    p.query(
                        p.per_minute(
                            m.RPC_CLIENT_CALL_DURATION, ["rpc_method", "error_type"], 'error_type!=""'
                        ),
                        "{{rpc_method}} {{error_type}}",
                    )
                ],
                unit="opm",
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Database statement latency by operation",
                "p95 of each SQL statement at the driver, by verb "
                "(SubmitJob's own statements and bulk COPYs included).",
                p.quantile_queries(m.DB_CLIENT_OPERATION_DURATION, ["db_operation_name"], quantiles=(0.95,)),
                unit="s",
            )
        )
        .with_panel(
            p.graph(
                "Database errors by operation",
                "Statements that failed per minute, by verb and error (a SQLSTATE such as 40001 "
                "for a serialization failure, or the driver's exception).",
                [
                    p.query(
                        p.per_minute(
                            m.DB_CLIENT_OPERATION_DURATION,
                            ["db_operation_name", "error_type"],
                            'error_type!=""',
                        ),
                        "{{db_operation_name}} {{error_type}}",
                    )
                ],
                unit="opm",
                stacked=True,
            )
        )
        .with_panel(
            p.graph(
                "Calls refused by authorization",
                "gRPC calls a gpufleet server refused by its authorization table, per minute, by "
                "method and reason (unauthenticated, no_rule, wrong_role); each is logged with "
                "the caller and the peer.",
                [p.query(p.per_minute(m.AUTH_REFUSALS, ["method", "reason"]), "{{method}} {{reason}}")],
                unit="opm",
                stacked=True,
                width=p.FULL,
            )
        )
    )
