"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-12-02

The whole schema of DESIGN §2, §5, §6 and §9. The failure ledger is append-only:
triggers refuse UPDATE and DELETE on `failures` (PostgreSQL and SQLite alike).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import gpufleet.common.db.models

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('failures',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('machine_id', sa.String(length=64), nullable=True),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('attempt_id', sa.String(length=64), nullable=True),
    sa.Column('failure_class', sa.String(length=64), nullable=False),
    sa.Column('detector', sa.String(length=64), nullable=False),
    sa.Column('details', sa.Text(), nullable=False),
    sa.Column('outcome', sa.String(length=32), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('failures', schema=None) as batch_op:
        batch_op.create_index('ix_failures_class', ['failure_class', 'id'], unique=False)
        batch_op.create_index('ix_failures_machine', ['machine_id', 'id'], unique=False)

    op.create_table('incidents',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('failure_class', sa.String(length=64), nullable=False),
    sa.Column('machine_id', sa.String(length=64), nullable=True),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('acknowledged_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('acknowledged_by', sa.String(length=128), nullable=True),
    sa.Column('dedupe_key', sa.String(length=200), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    op.create_table('job_kinds',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('slots', sa.Integer(), nullable=False),
    sa.Column('time_limit_s', sa.Float(), nullable=False),
    sa.Column('runs_writer_code', sa.Boolean(), nullable=False),
    sa.Column('queue_wait_deadline_s', sa.Float(), nullable=False),
    sa.Column('retry_budget', sa.Integer(), nullable=False),
    sa.Column('lost_retry_budget', sa.Integer(), nullable=False),
    sa.Column('resumes_from_checkpoint', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('leader_leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=200), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('plans',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tier', sa.Integer(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('max_gpu_jobs', sa.Integer(), nullable=False),
    sa.Column('rate_micros', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('pools',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=False),
    sa.Column('slots_per_machine', sa.Integer(), nullable=False),
    sa.Column('warm_target', sa.Integer(), nullable=False),
    sa.Column('max_machines', sa.Integer(), nullable=False),
    sa.Column('idle_since', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('quarantines',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=24), nullable=False),
    sa.Column('offering_id', sa.String(length=64), nullable=True),
    sa.Column('provider', sa.String(length=16), nullable=True),
    sa.Column('region', sa.String(length=64), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('expires_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('cleared_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('watchdog_stats',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('service', sa.String(length=32), nullable=False),
    sa.Column('cadence_s', sa.Float(), nullable=False),
    sa.Column('last_run_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('runs', sa.BigInteger(), nullable=False),
    sa.Column('actions', sa.JSON(), nullable=False),
    sa.Column('refusals', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('machines',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('pool_id', sa.String(length=64), nullable=True),
    sa.Column('offering_id', sa.String(length=64), nullable=True),
    sa.Column('provider', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('instance_type', sa.String(length=64), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('slots', sa.Integer(), nullable=False),
    sa.Column('capacity_type', sa.String(length=16), nullable=False),
    sa.Column('hourly_price_micros', sa.BigInteger(), nullable=False),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.Column('managed', sa.Boolean(), nullable=False),
    sa.Column('workload_class', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('intent', sa.String(length=16), nullable=False),
    sa.Column('lost', sa.Boolean(), nullable=False),
    sa.Column('cordoned', sa.Boolean(), nullable=False),
    sa.Column('provider_instance_id', sa.String(length=128), nullable=True),
    sa.Column('agent_address', sa.String(length=256), nullable=True),
    sa.Column('provider_seen_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('probe_ok_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('probe_failed_since', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('worker_report_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('requested_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('provision_deadline_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('first_observed_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('state_changed_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('startup_failed_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('stop_due_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('destroy_due_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('preemption_count', sa.Integer(), nullable=False),
    sa.Column('spot_seconds', sa.Float(), nullable=False),
    sa.Column('start_failures', sa.Integer(), nullable=False),
    sa.Column('backoff_until', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('machines', schema=None) as batch_op:
        batch_op.create_index('ix_machines_destroy_due', ['destroy_due_at'], unique=False, postgresql_where=sa.text('destroy_due_at IS NOT NULL'), sqlite_where=sa.text('destroy_due_at IS NOT NULL'))
        batch_op.create_index('ix_machines_live_state', ['state'], unique=False, postgresql_where=sa.text("state <> 'DESTROYED'"), sqlite_where=sa.text("state <> 'DESTROYED'"))
        batch_op.create_index('ix_machines_pool', ['pool_id'], unique=False)
        batch_op.create_index('ix_machines_provider_instance', ['provider', 'provider_instance_id'], unique=False)
        batch_op.create_index('ix_machines_stop_due', ['stop_due_at'], unique=False, postgresql_where=sa.text('stop_due_at IS NOT NULL'), sqlite_where=sa.text('stop_due_at IS NOT NULL'))

    op.create_table('offerings',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('pool_id', sa.String(length=64), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('provider', sa.String(length=16), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('zone', sa.String(length=64), nullable=False),
    sa.Column('instance_type', sa.String(length=64), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('slots', sa.Integer(), nullable=False),
    sa.Column('capacity_type', sa.String(length=16), nullable=False),
    sa.Column('hourly_price_micros', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('workspaces',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('plan_id', sa.String(length=64), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('jobs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('workspace_id', sa.String(length=64), nullable=False),
    sa.Column('pool_id', sa.String(length=64), nullable=False),
    sa.Column('kind_id', sa.String(length=64), nullable=False),
    sa.Column('pipeline_version', sa.String(length=64), nullable=False),
    sa.Column('tenant_values', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('created_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('started_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('ended_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('not_before', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('attempt_count', sa.Integer(), nullable=False),
    sa.Column('failure_retries_used', sa.Integer(), nullable=False),
    sa.Column('lost_retries_used', sa.Integer(), nullable=False),
    sa.Column('status_message', sa.Text(), nullable=False),
    sa.Column('slot_seconds', sa.Float(), nullable=False),
    sa.Column('charge_micros', sa.BigInteger(), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('paid_wait_incident', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['kind_id'], ['job_kinds.id'], ),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], ),
    sa.ForeignKeyConstraint(['workspace_id'], ['workspaces.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('request_id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_state_created', ['state', 'created_at'], unique=False)
        batch_op.create_index('ix_jobs_workspace', ['workspace_id', 'created_at'], unique=False)

    op.create_table('attempts',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('machine_id', sa.String(length=64), nullable=False),
    sa.Column('slot', sa.Integer(), nullable=False),
    sa.Column('slots', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('started_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('ended_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column('lease_expires_at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('slot_seconds', sa.Float(), nullable=False),
    sa.Column('charged', sa.Boolean(), nullable=False),
    sa.Column('charge_micros', sa.BigInteger(), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('status_message', sa.Text(), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.ForeignKeyConstraint(['machine_id'], ['machines.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_job', ['job_id'], unique=False)
        batch_op.create_index('ix_attempts_live', ['state', 'lease_expires_at'], unique=False, postgresql_where=sa.text("state IN ('STARTING','RUNNING')"), sqlite_where=sa.text("state IN ('STARTING','RUNNING')"))
        batch_op.create_index('ix_attempts_machine', ['machine_id', 'state'], unique=False)

    op.create_table('job_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('at', gpufleet.common.db.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.create_index('ix_job_events_job', ['job_id', 'id'], unique=False)


    _make_ledger_append_only()


def _make_ledger_append_only() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION failures_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION 'the failure ledger is append-only (% refused)', TG_OP
                    USING ERRCODE = 'insufficient_privilege';
            END;
            $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER failures_append_only BEFORE UPDATE OR DELETE ON failures "
            "FOR EACH ROW EXECUTE FUNCTION failures_append_only()"
        )
        op.execute(
            "CREATE TRIGGER failures_no_truncate BEFORE TRUNCATE ON failures "
            "FOR EACH STATEMENT EXECUTE FUNCTION failures_append_only()"
        )
    else:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER failures_no_{action.lower()} BEFORE {action} ON failures "
                f"BEGIN SELECT RAISE(ABORT, 'the failure ledger is append-only ({action} refused)'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS failures_append_only ON failures")
        op.execute("DROP TRIGGER IF EXISTS failures_no_truncate ON failures")
        op.execute("DROP FUNCTION IF EXISTS failures_append_only()")
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_index('ix_job_events_job')

    op.drop_table('job_events')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_machine')
        batch_op.drop_index('ix_attempts_live', postgresql_where=sa.text("state IN ('STARTING','RUNNING')"), sqlite_where=sa.text("state IN ('STARTING','RUNNING')"))
        batch_op.drop_index('ix_attempts_job')

    op.drop_table('attempts')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_workspace')
        batch_op.drop_index('ix_jobs_state_created')

    op.drop_table('jobs')
    op.drop_table('workspaces')
    op.drop_table('offerings')
    with op.batch_alter_table('machines', schema=None) as batch_op:
        batch_op.drop_index('ix_machines_stop_due', postgresql_where=sa.text('stop_due_at IS NOT NULL'), sqlite_where=sa.text('stop_due_at IS NOT NULL'))
        batch_op.drop_index('ix_machines_provider_instance')
        batch_op.drop_index('ix_machines_pool')
        batch_op.drop_index('ix_machines_live_state', postgresql_where=sa.text("state <> 'DESTROYED'"), sqlite_where=sa.text("state <> 'DESTROYED'"))
        batch_op.drop_index('ix_machines_destroy_due', postgresql_where=sa.text('destroy_due_at IS NOT NULL'), sqlite_where=sa.text('destroy_due_at IS NOT NULL'))

    op.drop_table('machines')
    op.drop_table('watchdog_stats')
    op.drop_table('quarantines')
    op.drop_table('pools')
    op.drop_table('plans')
    op.drop_table('leader_leases')
    op.drop_table('job_kinds')
    op.drop_table('incidents')
    with op.batch_alter_table('failures', schema=None) as batch_op:
        batch_op.drop_index('ix_failures_machine')
        batch_op.drop_index('ix_failures_class')

    op.drop_table('failures')
