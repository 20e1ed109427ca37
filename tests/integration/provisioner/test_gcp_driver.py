"""The gcp driver against the project's Compute Engine REST fake (tests/support/gce_fake).

The contract suite (test_driver_contract.py) holds it to what every driver keeps; this
file covers what is GCE's own: lost answers and requestId, the insert body, aggregatedList
paging, stockouts and quotas as operation errors, bounded waits, every error class on
every call that GCE can fail that way, and the real provisioner process serving it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.errors import AlreadyExists, FailedPrecondition, GpufleetError
from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    CapacityType,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    idempotency_key,
)
from gpufleet.provisioner.drivers.gcp import GcpClients, GcpDriver
from gpufleet.v1 import machine_pb2, provisioner_service_pb2
from tests.support import tls
from tests.support.gce_fake import GceFake, Latencies
from tests.support.gce_fake.harness import GCP_OFFERING, GCP_SPOT_OFFERING, TEST_IMAGE, gcp_driver_for
from tests.support.procs import start_service

DEPLOYMENT = "gcp-test"
ZONE = GCP_OFFERING.zone


@pytest.fixture
def fake() -> Iterator[GceFake]:
    with GceFake(latencies=Latencies(insert=0.05, start=0.05, stop=0.05, delete=0.05)) as running:
        yield running


@pytest.fixture
def driver(fake: GceFake) -> GcpDriver:
    return gcp_driver_for(fake, DEPLOYMENT)


def new_machine() -> str:
    return str(uuid.uuid4())


def spec(machine_id: str, offering: Offering = GCP_OFFERING) -> InstanceSpec:
    return InstanceSpec(machine_id=machine_id, offering=offering)


def ref(machine_id: str, provider_instance_id: str = "", offering: Offering = GCP_OFFERING) -> InstanceRef:
    return InstanceRef(machine_id=machine_id, offering=offering, provider_instance_id=provider_instance_id)


def labelled(fake: GceFake, machine_id: str) -> list[dict[str, object]]:
    return [i for i in fake.instances() if i["labels"].get(MACHINE_LABEL) == machine_id]  # type: ignore[union-attr]


# ---- idempotent create -------------------------------------------------------------------


def test_a_lost_insert_answer_then_a_retried_create_makes_no_second_instance(
    fake: GceFake, driver: GcpDriver
) -> None:
    machine_id = new_machine()
    fake.drop_next_response("insert")
    with pytest.raises(NotYetDone):  # GCE got the insert; whether it worked is unknown here
        driver.create(spec(machine_id))
    assert len(labelled(fake, machine_id)) == 1

    again = driver.create(spec(machine_id))
    assert [i["id"] for i in labelled(fake, machine_id)] == [again.provider_instance_id]
    assert len(fake.requests_of("insert")) == 1  # the retry adopted by label, it did not insert


@pytest.fixture
def instant_fake() -> Iterator[GceFake]:
    """Operations finish as they are answered: a driver on a manual clock never waits."""
    with GceFake() as running:
        yield running


def test_the_same_insert_again_is_the_same_request_to_gce(fake: GceFake, driver: GcpDriver) -> None:
    """A retried insert (same requestId) gets the first one's operation and creates nothing."""
    machine_id = new_machine()
    driver.create(spec(machine_id))
    (sent,) = fake.requests_of("insert")
    window = int(driver.clock.now().timestamp() // driver.options.request_id_window_s)
    assert sent.query["requestId"] == idempotency_key(machine_id, f"create:{ZONE}@{window}")

    client = GcpClients.connect(fake.endpoint, AnonymousCredentials()).instances
    request = compute_v1.InsertInstanceRequest(
        project=fake.project,
        zone=ZONE,
        instance_resource=compute_v1.Instance.from_json(json.dumps(sent.body), ignore_unknown_fields=True),
        request_id=sent.query["requestId"],
    )
    first_op = client.insert_unary(request=request, retry=None, timeout=10)
    second_op = client.insert_unary(request=request, retry=None, timeout=10)
    assert first_op.name == second_op.name
    assert len(labelled(fake, machine_id)) == 1


def test_a_failed_create_is_replayed_within_the_request_id_window_and_retried_after_it(
    instant_fake: GceFake,
) -> None:
    clock = ManualClock()
    driver = gcp_driver_for(instant_fake, DEPLOYMENT, clock=clock, request_id_window_s=600)
    machine_id = new_machine()
    instant_fake.set_stockout(ZONE)
    with pytest.raises(InsufficientCapacity):
        driver.create(spec(machine_id))
    instant_fake.set_stockout(ZONE, out=False)
    with pytest.raises(InsufficientCapacity):  # GCE answers the same request id with the same failure
        driver.create(spec(machine_id))
    clock.advance(600)
    assert driver.create(spec(machine_id)).status is InstanceStatus.RUNNING
    keys = [r.query["requestId"] for r in instant_fake.requests_of("insert")]
    assert keys[0] == keys[1] != keys[2]


def test_a_create_in_another_zone_is_a_new_request(instant_fake: GceFake) -> None:
    driver = gcp_driver_for(instant_fake, DEPLOYMENT, clock=ManualClock())
    machine_id = new_machine()
    instant_fake.set_stockout(ZONE)
    with pytest.raises(InsufficientCapacity):
        driver.create(spec(machine_id))
    assert driver.create(spec(machine_id, GCP_SPOT_OFFERING)).zone == GCP_SPOT_OFFERING.zone


def test_a_start_that_met_a_stockout_starts_once_the_window_has_passed(instant_fake: GceFake) -> None:
    clock = ManualClock()
    driver = gcp_driver_for(instant_fake, DEPLOYMENT, clock=clock, request_id_window_s=300)
    machine_id = new_machine()
    driver.create(spec(machine_id))
    driver.stop(ref(machine_id))
    instant_fake.set_stockout(ZONE)
    with pytest.raises(InsufficientCapacity):
        driver.start(ref(machine_id))
    instant_fake.set_stockout(ZONE, out=False)
    clock.advance(300)
    assert driver.start(ref(machine_id)).status is InstanceStatus.RUNNING


def test_a_name_taken_by_someone_elses_instance_is_already_exists(fake: GceFake, driver: GcpDriver) -> None:
    machine_id = new_machine()
    planted = fake.plant(ZONE, f"gf-{machine_id}", {"owner": "a-person"})
    with pytest.raises(AlreadyExists):
        driver.create(spec(machine_id))
    assert [i["id"] for i in fake.instances()] == [planted["id"]]
    assert fake.instances()[0]["labels"] == {"owner": "a-person"}


# ---- what is sent ------------------------------------------------------------------------


def test_a_spot_insert_asks_for_spot_stopped_on_reclaim_labelled_and_without_service_account(
    fake: GceFake, driver: GcpDriver
) -> None:
    machine_id = new_machine()
    info = driver.create(spec(machine_id, GCP_SPOT_OFFERING))
    (sent,) = fake.requests_of("insert")
    body = sent.body or {}
    assert sent.path.endswith(f"/zones/{GCP_SPOT_OFFERING.zone}/instances")
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["machineType"] == f"zones/{GCP_SPOT_OFFERING.zone}/machineTypes/g2-standard-4"
    assert body["labels"] == {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id}
    assert not body.get("serviceAccounts")
    (disk,) = body["disks"]
    assert disk["initializeParams"]["sourceImage"] == TEST_IMAGE
    assert disk["initializeParams"]["labels"] == body["labels"]
    metadata = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert metadata["gpufleet-machine-id"] == machine_id
    assert (info.capacity_type, info.instance_type, info.region) == (
        CapacityType.SPOT,
        "g2-standard-4",
        "europe-west4",
    )


def test_an_on_demand_insert_is_standard_and_restarts_after_a_host_event(
    fake: GceFake, driver: GcpDriver
) -> None:
    info = driver.create(spec(new_machine()))
    (sent,) = fake.requests_of("insert")
    assert (sent.body or {})["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    assert info.capacity_type is CapacityType.ON_DEMAND
    assert info.agent_address.endswith(":50060")


def test_a_reclaimed_spot_machine_reads_stopped_and_starts_again(fake: GceFake, driver: GcpDriver) -> None:
    machine_id = new_machine()
    info = driver.create(spec(machine_id, GCP_SPOT_OFFERING))
    fake.preempt(GCP_SPOT_OFFERING.zone, f"gf-{machine_id}")
    stopped = driver.get(ref(machine_id, info.provider_instance_id, GCP_SPOT_OFFERING))
    assert (stopped.status, stopped.capacity_type, stopped.agent_address) == (
        InstanceStatus.STOPPED,
        CapacityType.SPOT,
        "",
    )
    assert driver.start(ref(machine_id, offering=GCP_SPOT_OFFERING)).status in (
        InstanceStatus.PENDING,
        InstanceStatus.RUNNING,
    )


def test_a_suspended_instance_is_stopped_and_start_resumes_it(fake: GceFake, driver: GcpDriver) -> None:
    machine_id = new_machine()
    fake.plant(
        ZONE,
        f"gf-{machine_id}",
        {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id},
        status="SUSPENDED",
    )
    assert driver.get(ref(machine_id)).status is InstanceStatus.STOPPED
    driver.start(ref(machine_id))
    assert [r.kind for r in fake.requests if r.kind in ("start", "resume")] == ["resume"]


# ---- list ----------------------------------------------------------------------------------


def test_list_reads_every_zone_and_page_and_returns_only_our_deployment(fake: GceFake) -> None:
    driver = gcp_driver_for(fake, DEPLOYMENT, page_size=2)
    ours = {}
    for zone, count in (("us-central1-a", 2), ("europe-west4-a", 2), ("asia-southeast1-b", 1)):
        for _ in range(count):
            machine_id = new_machine()
            ours[machine_id] = fake.plant(
                zone, f"gf-{machine_id}", {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id}
            )
    fake.plant("us-central1-a", "someone-elses", {DEPLOYMENT_LABEL: "other-deployment", MACHINE_LABEL: "m-x"})
    fake.plant("europe-west4-a", "unlabelled", {})

    found = driver.list()

    assert {i.machine_id: i.provider_instance_id for i in found} == {m: i["id"] for m, i in ours.items()}
    assert {i.zone for i in found} == {"us-central1-a", "europe-west4-a", "asia-southeast1-b"}
    pages = fake.requests_of("aggregatedList")
    assert len(pages) == 3
    assert all(p.query["filter"] == f'(labels.{DEPLOYMENT_LABEL} = "{DEPLOYMENT}")' for p in pages)
    assert [bool(p.query.get("pageToken")) for p in pages] == [False, True, True]
    assert {p.query["maxResults"] for p in pages} == {"2"}


def test_a_list_that_fails_on_a_later_page_is_an_error_not_a_short_list(fake: GceFake) -> None:
    driver = gcp_driver_for(fake, DEPLOYMENT, page_size=1)
    for _ in range(3):
        machine_id = new_machine()
        fake.plant(ZONE, f"gf-{machine_id}", {DEPLOYMENT_LABEL: DEPLOYMENT, MACHINE_LABEL: machine_id})
    assert len(driver.list()) == 3
    fake.fail_next("aggregatedList", 503, after=1)  # the first page answers, the second fails
    with pytest.raises(Transient):
        driver.list()
    assert [bool(p.query.get("pageToken")) for p in fake.requests_of("aggregatedList")][-2:] == [False, True]


# ---- stockouts, quotas, bounded waits -------------------------------------------------------


def test_a_stockout_arrives_as_an_operation_error_and_is_insufficient_capacity(
    fake: GceFake, driver: GcpDriver
) -> None:
    fake.set_stockout(ZONE)
    machine_id = new_machine()
    with pytest.raises(InsufficientCapacity):
        driver.create(spec(machine_id))
    (op,) = fake.operations("insert")
    assert (op["status"], op["httpErrorStatusCode"]) == ("DONE", 503)
    assert [e["code"] for e in op["error"]["errors"]] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    assert labelled(fake, machine_id) == []  # a failed insert leaves nothing behind
    assert driver.create(spec(new_machine(), GCP_SPOT_OFFERING)).status is InstanceStatus.RUNNING


def test_a_stopped_machine_in_a_zone_out_of_gpus_cannot_start_and_stays_stopped(
    fake: GceFake, driver: GcpDriver
) -> None:
    machine_id = new_machine()
    driver.create(spec(machine_id))
    driver.stop(ref(machine_id))
    fake.set_stockout(ZONE)
    with pytest.raises(InsufficientCapacity):
        driver.start(ref(machine_id))
    assert driver.get(ref(machine_id)).status is InstanceStatus.STOPPED


def test_a_regional_gpu_quota_is_quota_exceeded(fake: GceFake, driver: GcpDriver) -> None:
    fake.set_gpu_quota("us-central1", 1)
    driver.create(spec(new_machine()))
    with pytest.raises(QuotaExceeded):
        driver.create(spec(new_machine()))


def test_an_operation_that_never_finishes_is_not_yet_done_within_the_bound(fake: GceFake) -> None:
    driver = gcp_driver_for(fake, DEPLOYMENT, operation_wait_s=0.6, operation_poll_s=0.2)
    fake.hang_operations("insert")
    machine_id = new_machine()
    began = time.monotonic()
    with pytest.raises(NotYetDone):
        driver.create(spec(machine_id))
    assert 0.6 <= time.monotonic() - began < 3.0
    assert len(fake.requests_of("operations.wait")) >= 2  # polled, each poll held server-side
    # The instance exists, still provisioning: a retried create adopts it.
    assert driver.create(spec(machine_id)).status is InstanceStatus.PENDING


# ---- every error class, on every call GCE can fail that way -----------------------------------


@dataclass(frozen=True)
class Case:
    op: str
    script: Callable[[GceFake], None]
    error: type[GpufleetError]


def _op_fault(kind: str, code: str, status: int) -> Callable[[GceFake], None]:
    return lambda f: f.fail_next_operation(kind, code, http_status=status)


def _http(kind: str, status: int, reason: str | None = None) -> Callable[[GceFake], None]:
    return lambda f: f.fail_next(kind, status, reason)


CASES: dict[str, Case] = {
    # create: insert answers, insert operations, the adoption list
    "create-capacity-with-details": Case(
        "create", _op_fault("insert", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", 503), InsufficientCapacity
    ),
    "create-quota-operation": Case("create", _op_fault("insert", "QUOTA_EXCEEDED", 403), QuotaExceeded),
    "create-quota-403": Case("create", _http("insert", 403, "quotaExceeded"), QuotaExceeded),
    "create-auth-401": Case("create", _http("insert", 401), AuthFailed),
    "create-auth-403": Case("create", _http("insert", 403), AuthFailed),
    "create-throttled-403": Case("create", _http("insert", 403, "rateLimitExceeded"), Transient),
    "create-429": Case("create", _http("insert", 429), Transient),
    "create-503": Case("create", _http("insert", 503), Transient),
    "create-list-503": Case("create", _http("aggregatedList", 503), Transient),
    "create-invalid": Case("create", _http("insert", 400), FailedPrecondition),
    "create-hangs": Case("create", lambda f: f.hang_operations("insert"), NotYetDone),
    "create-answer-lost": Case("create", lambda f: f.drop_next_response("insert"), NotYetDone),
    # start (of a stopped machine)
    "start-missing": Case("start", _http("get", 404), InstanceNotFound),
    "start-capacity": Case(
        "start", _op_fault("start", "ZONE_RESOURCE_POOL_EXHAUSTED", 503), InsufficientCapacity
    ),
    "start-quota": Case("start", _op_fault("start", "QUOTA_EXCEEDED", 403), QuotaExceeded),
    "start-auth": Case("start", _http("start", 403), AuthFailed),
    "start-503": Case("start", _http("start", 503), Transient),
    "start-hangs": Case("start", lambda f: f.hang_operations("start"), NotYetDone),
    # stop (of a running machine)
    "stop-missing": Case("stop", _http("get", 404), InstanceNotFound),
    "stop-auth": Case("stop", _http("stop", 401), AuthFailed),
    "stop-429": Case("stop", _http("stop", 429), Transient),
    "stop-hangs": Case("stop", lambda f: f.hang_operations("stop"), NotYetDone),
    # destroy
    "destroy-auth": Case("destroy", _http("delete", 403), AuthFailed),
    "destroy-500": Case("destroy", _http("delete", 500), Transient),
    "destroy-read-503": Case("destroy", _http("get", 503), Transient),
    "destroy-hangs": Case("destroy", lambda f: f.hang_operations("delete"), NotYetDone),
    # get and list
    "get-missing": Case("get", _http("get", 404), InstanceNotFound),
    "get-auth-401": Case("get", _http("get", 401), AuthFailed),
    "get-auth-403": Case("get", _http("get", 403), AuthFailed),
    "get-429": Case("get", _http("get", 429), Transient),
    "get-503": Case("get", _http("get", 503), Transient),
    "list-auth": Case("list", _http("aggregatedList", 401), AuthFailed),
    "list-forbidden": Case("list", _http("aggregatedList", 403), AuthFailed),
    "list-503": Case("list", _http("aggregatedList", 503), Transient),
    "list-answer-lost": Case("list", lambda f: f.drop_next_response("aggregatedList"), Transient),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_each_gce_failure_arrives_as_its_typed_error(fake: GceFake, case: Case) -> None:
    driver = gcp_driver_for(fake, DEPLOYMENT, operation_wait_s=0.5, operation_poll_s=0.2)
    existing = new_machine()
    driver.create(spec(existing))
    if case.op == "start":
        driver.stop(ref(existing))
    target = new_machine() if case.op == "create" else existing
    calls: dict[str, Callable[[], object]] = {
        "create": lambda: driver.create(spec(target)),
        "start": lambda: driver.start(ref(target)),
        "stop": lambda: driver.stop(ref(target)),
        "destroy": lambda: driver.destroy(ref(target)),
        "get": lambda: driver.get(ref(target)),
        "list": driver.list,
    }
    case.script(fake)
    with pytest.raises(case.error) as raised:
        calls[case.op]()
    assert type(raised.value) is case.error


def test_refused_credentials_are_auth_failed_for_every_call(fake: GceFake, driver: GcpDriver) -> None:
    machine_id = new_machine()
    driver.create(spec(machine_id))
    fake.refuse_credentials(401)
    for call in (
        lambda: driver.create(spec(new_machine())),
        lambda: driver.get(ref(machine_id)),
        lambda: driver.stop(ref(machine_id)),
        lambda: driver.destroy(ref(machine_id)),
        driver.list,
    ):
        with pytest.raises(AuthFailed):
            call()


def test_a_destroy_whose_delete_finds_nothing_is_still_done(fake: GceFake, driver: GcpDriver) -> None:
    machine_id = new_machine()
    driver.create(spec(machine_id))
    fake.fail_next("delete", 404)  # gone between our read and our delete
    assert driver.destroy(ref(machine_id)) is True
    assert driver.destroy(ref(new_machine())) is False


# ---- the real provisioner process ------------------------------------------------------------

GCP = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_GCP,
    region="us-central1",
    zone="us-central1-a",
    instance_type="g2-standard-8",
    slots=2,
    gpu_count=1,
)
GCP_OUT = machine_pb2.Offering(
    provider=machine_pb2.PROVIDER_GCP,
    region="us-central1",
    zone="us-central1-b",
    instance_type="g2-standard-8",
    slots=2,
    capacity_type=machine_pb2.CAPACITY_TYPE_SPOT,
)


def test_the_provisioner_process_serves_gcp_over_grpc(fake: GceFake, tmp_path: Path) -> None:
    service = start_service(
        "provisioner",
        tmp_path,
        {
            "GPUFLEET_DEPLOYMENT_ID": "proc-gcp",
            "GPUFLEET_DRIVERS": "gcp",
            "GPUFLEET_GCP_PROJECT": fake.project,
            "GPUFLEET_GCP_ZONES": "us-central1-a,us-central1-b",
            "GPUFLEET_GCP_IMAGE": TEST_IMAGE,
            "GPUFLEET_GCP_API_ENDPOINT": fake.endpoint,
            "GPUFLEET_GCP_ANONYMOUS_CREDENTIALS": "true",
            "GPUFLEET_GCP_OPERATION_WAIT_S": "10",
        },
    )
    client = ProvisionerClient(service.address, tls.transport("scheduler", "proc-gcp"), timeout_s=30)
    try:
        fake.plant("us-central1-a", "foreign", {DEPLOYMENT_LABEL: "another", MACHINE_LABEL: "m-foreign"})
        made = client.create("m-gcp", GCP, request_id="r-1")
        assert made.status in (
            provisioner_service_pb2.INSTANCE_STATUS_PENDING,
            provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
        )
        assert client.create("m-gcp", GCP, request_id="r-2").provider_instance_id == made.provider_instance_id
        instances, unreachable = client.list_all()
        assert ([i.machine_id for i in instances], unreachable) == (["m-gcp"], [])

        fake.set_stockout("us-central1-b")
        with pytest.raises(InsufficientCapacity):
            client.create("m-out", GCP_OUT, request_id="r-3")

        stopped = client.stop("m-gcp", GCP, made.provider_instance_id, request_id="r-4")
        assert stopped.status == provisioner_service_pb2.INSTANCE_STATUS_STOPPED
        started = client.start("m-gcp", GCP, made.provider_instance_id, request_id="r-5")
        assert started.status in (
            provisioner_service_pb2.INSTANCE_STATUS_PENDING,
            provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
        )
        assert client.destroy("m-gcp", GCP, made.provider_instance_id, request_id="r-6") is True
        assert client.destroy("m-gcp", GCP, made.provider_instance_id, request_id="r-7") is False
        with pytest.raises(InstanceNotFound):
            client.get("m-gcp", GCP, made.provider_instance_id)
        assert [i["name"] for i in fake.instances()] == ["foreign"]

        fake.refuse_credentials(401)
        with pytest.raises(AuthFailed):
            client.get("m-gcp", GCP, "")
        assert client.list_all() == ([], [machine_pb2.PROVIDER_GCP])
    finally:
        client.close()
        service.stop()


def test_a_machine_is_born_with_its_own_certificate_in_its_instance_metadata(fake: GceFake) -> None:
    from cryptography import x509

    from gpufleet.common.trust.pki import machine_ca_subject
    from tests.support import tls

    driver = gcp_driver_for(fake, DEPLOYMENT, machine_issuer=tls.machine_issuer(DEPLOYMENT))
    machine_id = new_machine()
    driver.create(spec(machine_id))
    (sent,) = fake.requests_of("insert")
    metadata = {item["key"]: item["value"] for item in (sent.body or {})["metadata"]["items"]}
    cert = x509.load_pem_x509_certificate(metadata["gpufleet-tls-cert"].encode())
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://gpufleet.{DEPLOYMENT}/machine/{machine_id}"
    ]
    assert cert.issuer == machine_ca_subject(DEPLOYMENT)
    assert "PRIVATE KEY" in metadata["gpufleet-tls-key"] and "CERTIFICATE" in metadata["gpufleet-tls-ca"]
    # Without an issuer (a provisioner run insecure for development) no credential is sent.
    plain = gcp_driver_for(fake, DEPLOYMENT)
    plain.create(spec(new_machine()))
    last = fake.requests_of("insert")[-1].body or {}
    assert not [i for i in last["metadata"]["items"] if i["key"].startswith("gpufleet-tls")]
