"""The Compute Engine REST fake itself, spoken to in raw HTTP: its shapes and its script.

The gcp driver's tests trust it, so it is held here to what real GCE answers.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from gpufleet.common.clock import ManualClock
from tests.support.gce_fake import GceFake, Latencies

P = "/compute/v1/projects/gpufleet-test"
ZONE = "us-central1-a"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[GceFake]:
    with GceFake(
        clock=clock, latencies=Latencies(insert=30, start=20, stop=20, delete=10), wait_cap_s=0.05
    ) as running:
        yield running


def call(fake: GceFake, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = Request(
        fake.endpoint + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except HTTPError as err:
        return err.code, json.loads(err.read())


def instance(name: str, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/g2-standard-8",
        "labels": labels or {},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {"sourceImage": "projects/i/global/images/x"},
            }
        ],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": True},
        **extra,
    }


def insert(fake: GceFake, name: str, request_id: str = "", **kwargs: Any) -> tuple[int, Any]:
    query = f"?requestId={request_id}" if request_id else ""
    return call(fake, "POST", f"{P}/zones/{ZONE}/instances{query}", instance(name, **kwargs))


def test_an_insert_is_an_operation_that_finishes_with_the_instance_running(
    fake: GceFake, clock: ManualClock
) -> None:
    status, op = insert(fake, "vm-1", str(uuid.uuid4()), labels={"team": "a"})
    assert status == 200
    assert (op["kind"], op["operationType"], op["status"]) == ("compute#operation", "insert", "PENDING")
    assert op["targetLink"].endswith(f"/zones/{ZONE}/instances/vm-1")
    assert call(fake, "GET", f"{P}/zones/{ZONE}/instances/vm-1")[1]["status"] == "PROVISIONING"
    clock.advance(20)
    assert call(fake, "GET", f"{P}/zones/{ZONE}/operations/{op['name']}")[1]["status"] == "RUNNING"
    assert call(fake, "GET", f"{P}/zones/{ZONE}/instances/vm-1")[1]["status"] == "STAGING"
    clock.advance(10)
    done = call(fake, "POST", f"{P}/zones/{ZONE}/operations/{op['name']}/wait")[1]
    assert (done["status"], done["progress"], "error" in done) == ("DONE", 100, False)
    vm = call(fake, "GET", f"{P}/zones/{ZONE}/instances/vm-1")[1]
    assert (vm["status"], vm["labels"], vm["kind"]) == ("RUNNING", {"team": "a"}, "compute#instance")
    assert isinstance(vm["id"], str) and vm["id"].isdigit()  # int64 travels as a string
    assert vm["creationTimestamp"].endswith("-08:00")
    assert vm["guestAccelerators"][0]["acceleratorCount"] == 1


def test_the_same_request_id_is_the_same_operation_and_nothing_new(fake: GceFake) -> None:
    request_id = str(uuid.uuid4())
    first = insert(fake, "vm-1", request_id)[1]
    second = insert(fake, "vm-1", request_id)[1]
    assert first["name"] == second["name"]
    assert len(fake.instances()) == 1
    status, body = insert(fake, "vm-1", str(uuid.uuid4()))  # another request for the same name
    assert status == 409 and body["error"]["errors"][0]["reason"] == "alreadyExists"
    assert insert(fake, "vm-2", "not-a-uuid")[0] == 400


def test_errors_have_gces_body(fake: GceFake) -> None:
    status, body = call(fake, "GET", f"{P}/zones/{ZONE}/instances/nope")
    assert status == 404
    assert body["error"]["code"] == 404
    assert (
        body["error"]["message"]
        == f"The resource 'projects/gpufleet-test/zones/{ZONE}/instances/nope' was not found"
    )
    assert body["error"]["errors"] == [
        {"message": body["error"]["message"], "domain": "global", "reason": "notFound"}
    ]
    fake.refuse_credentials(401)
    status, body = call(fake, "GET", f"{P}/aggregated/instances")
    assert status == 401
    assert body["error"]["details"][0]["reason"] == "CREDENTIALS_MISSING"


def test_invalid_inserts_are_refused_like_gce_refuses_them(fake: GceFake) -> None:
    assert insert(fake, "Bad_Name")[0] == 400
    assert (
        call(
            fake,
            "POST",
            f"{P}/zones/{ZONE}/instances",
            instance("vm", machineType="zones/z/machineTypes/nope"),
        )[0]
        == 400
    )
    assert insert(fake, "vm", labels={"Key": "v"})[0] == 400
    migrate = instance("vm", scheduling={"onHostMaintenance": "MIGRATE"})
    assert call(fake, "POST", f"{P}/zones/{ZONE}/instances", migrate)[0] == 400  # a GPU cannot live-migrate
    assert call(fake, "POST", f"{P}/zones/mars-1a/instances", instance("vm"))[0] == 400
    assert fake.instances() == []


def test_a_stockout_is_an_operation_error_and_the_instance_vanishes(
    fake: GceFake, clock: ManualClock
) -> None:
    fake.set_stockout(ZONE)
    op = insert(fake, "vm-1", str(uuid.uuid4()))[1]
    assert call(fake, "GET", f"{P}/zones/{ZONE}/instances/vm-1")[1]["status"] == "PROVISIONING"
    clock.advance(30)
    done = call(fake, "GET", f"{P}/zones/{ZONE}/operations/{op['name']}")[1]
    assert (done["status"], done["httpErrorStatusCode"], done["httpErrorMessage"]) == (
        "DONE",
        503,
        "SERVICE UNAVAILABLE",
    )
    (error,) = done["error"]["errors"]
    assert error["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert error["errorDetails"][0]["errorInfo"]["reason"] == "resource_availability"
    assert call(fake, "GET", f"{P}/zones/{ZONE}/instances/vm-1")[0] == 404


def test_a_regional_gpu_quota_fails_the_insert_operation_at_once(fake: GceFake) -> None:
    fake.set_gpu_quota("us-central1", 0)
    op = insert(fake, "vm-1")[1]
    assert (op["status"], op["httpErrorStatusCode"]) == ("DONE", 403)
    assert op["error"]["errors"][0]["code"] == "QUOTA_EXCEEDED"
    assert op["error"]["errors"][0]["errorDetails"][0]["quotaInfo"]["dimensions"] == {"region": "us-central1"}


def test_stop_start_and_delete_walk_gces_statuses(fake: GceFake, clock: ManualClock) -> None:
    insert(fake, "vm-1")
    clock.advance(30)
    base = f"{P}/zones/{ZONE}/instances/vm-1"
    call(fake, "POST", f"{base}/stop")
    assert call(fake, "GET", base)[1]["status"] == "STOPPING"
    clock.advance(20)
    stopped = call(fake, "GET", base)[1]
    assert stopped["status"] == "TERMINATED"  # GCE's word for a stopped instance
    assert "lastStopTimestamp" in stopped
    assert call(fake, "POST", f"{base}/stop")[1]["status"] == "DONE"  # stopping again: nothing to do
    call(fake, "POST", f"{base}/start")
    assert call(fake, "GET", base)[1]["status"] == "STAGING"
    clock.advance(20)
    assert call(fake, "GET", base)[1]["status"] == "RUNNING"
    op = call(fake, "DELETE", base)[1]
    assert call(fake, "GET", base)[1]["status"] == "STOPPING"
    clock.advance(10)
    assert call(fake, "GET", f"{P}/zones/{ZONE}/operations/{op['name']}")[1]["status"] == "DONE"
    assert call(fake, "GET", base)[0] == 404


def test_aggregated_list_pages_filters_and_warns_for_empty_zones(fake: GceFake) -> None:
    for zone, name in (("us-central1-a", "a1"), ("us-central1-a", "a2"), ("europe-west4-a", "e1")):
        fake.plant(zone, name, {"gpufleet-deployment": "d1"})
    fake.plant("us-central1-b", "other", {"gpufleet-deployment": "d2"})
    path = f"{P}/aggregated/instances?maxResults=2&filter=%28labels.gpufleet-deployment+%3D+%22d1%22%29"
    page1 = call(fake, "GET", path)[1]
    assert page1["kind"] == "compute#instanceAggregatedList"
    assert [i["name"] for i in page1["items"]["zones/europe-west4-a"]["instances"]] == ["e1"]
    assert [i["name"] for i in page1["items"]["zones/us-central1-a"]["instances"]] == ["a1"]
    empty = page1["items"]["zones/us-central1-b"]["warning"]
    assert empty["code"] == "NO_RESULTS_ON_PAGE"
    assert empty["data"] == [{"key": "scope", "value": "zones/us-central1-b"}]
    page2 = call(fake, "GET", f"{path}&pageToken={page1['nextPageToken']}")[1]
    assert [i["name"] for i in page2["items"]["zones/us-central1-a"]["instances"]] == ["a2"]
    assert "nextPageToken" not in page2
    assert call(fake, "GET", f"{P}/aggregated/instances?filter=labels.a+%3D")[0] == 400


def test_an_operation_can_hang_and_an_answer_can_be_lost(fake: GceFake, clock: ManualClock) -> None:
    fake.hang_operations("insert")
    op = insert(fake, "vm-1")[1]
    clock.advance(3600)
    assert call(fake, "POST", f"{P}/zones/{ZONE}/operations/{op['name']}/wait")[1]["status"] == "RUNNING"
    fake.drop_next_response("insert")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        insert(fake, "vm-2")
    assert sorted(i["name"] for i in fake.instances()) == ["vm-1", "vm-2"]  # done, though unanswered


def test_scripted_http_faults_fire_once_after_letting_some_through(fake: GceFake) -> None:
    fake.fail_next("aggregatedList", 503, after=1)
    assert call(fake, "GET", f"{P}/aggregated/instances")[0] == 200
    status, body = call(fake, "GET", f"{P}/aggregated/instances")
    assert (status, body["error"]["errors"][0]["reason"]) == (503, "backendError")
    assert call(fake, "GET", f"{P}/aggregated/instances")[0] == 200
