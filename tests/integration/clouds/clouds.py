"""The two clouds of the cross-cloud scenarios, each behind the same small test-side face.

:class:`GcpCloud` is the project's Compute Engine REST fake (tests/support/gce_fake);
:class:`AwsCloud` is moto's EC2 server with :class:`~tests.support.moto_server.Ec2Faults`
hooks on every client the aws driver builds. Both give the scenarios what they need to
script and to check at the provider itself — never through the platform's own records:

- script a stockout, a quota, refused credentials, a lost create answer, a pre-emption;
- plant an instance as someone else would (an orphan, another deployment's machine);
- read what lives there, and which calls the platform made to it.

Provider time is real time on both (moto stamps launch times from the wall clock, and the
GCE fake is left on its real clock to match); the platform runs on a manual clock that the
scenarios keep near real time, so launch times and sweeps can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.common.clock import Clock
from gpufleet.provisioner.drivers.base import DEPLOYMENT_LABEL, MACHINE_LABEL, Driver, Provider
from gpufleet.provisioner.drivers.gcp_instances import instance_name
from tests.support.gce_fake import GceFake
from tests.support.gce_fake.harness import gcp_driver_for
from tests.support.moto_server import Ec2Faults, ErrorAnswer, MotoServer, aws_driver_for


@dataclass(frozen=True)
class Seen:
    """One instance as the provider itself shows it (any deployment, any state but gone)."""

    provider_instance_id: str
    machine_label: str
    deployment_label: str
    status: str
    zone: str


class Cloud(Protocol):
    """What a scenario may do to, and read from, one cloud."""

    name: str
    provider: Provider
    region: str
    # Two zones of ``region``: a scenario's first and second choice in that cloud.
    zones: tuple[str, str]
    instance_type: str

    def driver(self, deployment_id: str, clock: Clock) -> Driver: ...

    def live(self) -> list[Seen]: ...

    def calls(self) -> int:
        """API requests this cloud has received from the platform so far."""
        ...

    def create_calls(self) -> int:
        """Create requests (GCE insert, EC2 RunInstances) received so far."""
        ...

    def destroy_requested(self, machine_id: str) -> bool:
        """Whether the platform asked this cloud to delete an instance of ``machine_id``."""
        ...

    def stockout(self, zone: str) -> None: ...

    def stockout_on_start(self, zone: str) -> None:
        """Starting a stopped instance in ``zone`` meets the cloud's "no capacity" answer."""
        ...

    def exceed_quota(self) -> None:
        """The next create in ``region`` meets the account's GPU quota."""
        ...

    def lift_quota(self) -> None: ...

    def refuse_credentials(self) -> None:
        """The platform's next call in ``region`` is refused as unauthenticated."""
        ...

    def accept_credentials(self) -> None: ...

    def lose_next_create_answer(self) -> None:
        """The next create is carried out, and its answer never reaches the platform."""
        ...

    def preempt(self, machine_id: str) -> None:
        """The provider takes the machine's spot instance back (stopped, disk kept)."""
        ...

    def shows_preempted_stop(self, machine_id: str) -> bool:
        """Whether the cloud's own API shows the machine's instance as a spot instance its
        pre-emption stopped, in that cloud's words."""
        ...

    def restart_by_itself(self, machine_id: str) -> None:
        """The machine's stopped instance runs again without the platform asking (EC2
        restarts an interrupted persistent spot instance when capacity returns; on GCE,
        which never does, a person at the console)."""
        ...

    def plant(self, machine_id: str, deployment_id: str, zone: str) -> str:
        """An instance made behind the platform's back, labelled for ``deployment_id`` and
        ``machine_id`` as the provisioner would have labelled it; returns its provider id."""
        ...

    def lag_lists(self) -> None:
        """From now on the cloud's list trails its creates: a new instance is not listed
        until :meth:`catch_up` (EC2's eventually consistent describe, GCE's list view)."""
        ...

    def catch_up(self) -> None:
        """The cloud's list shows every instance made so far."""
        ...

    def vanish(self, machine_id: str) -> None:
        """The machine's instance is deleted behind the platform's back."""
        ...

    def end_slowly(self) -> None:
        """From now on a destroy is accepted and not finished: the instance shows as ending
        (EC2 shutting-down; GCE STOPPING under a delete operation still running) until
        :meth:`finish_ending`."""
        ...

    def finish_ending(self) -> None:
        """Every instance left ending is gone now."""
        ...

    def hold_destroy(self, machine_id: str) -> None:
        """The delete call of that machine's instance hangs at the cloud's API, unanswered,
        until :meth:`release_destroys`; every other call is served meanwhile."""
        ...

    def release_destroys(self) -> None: ...


def labelled(cloud: Cloud, machine_id: str) -> list[Seen]:
    """The live instances at the provider that carry ``machine_id``'s label."""
    return [s for s in cloud.live() if s.machine_label == machine_id]


class GcpCloud:
    name = "gcp"
    provider = Provider.GCP
    region = "us-central1"
    zones = ("us-central1-a", "us-central1-b")
    instance_type = "g2-standard-4"  # one L4

    def __init__(self, fake: GceFake, **driver_options: Any) -> None:
        self.fake = fake
        self.driver_options = driver_options

    def driver(self, deployment_id: str, clock: Clock) -> Driver:
        return gcp_driver_for(self.fake, deployment_id, clock=clock, **self.driver_options)

    def live(self) -> list[Seen]:
        return [
            Seen(
                provider_instance_id=str(i["id"]),
                machine_label=i["labels"].get(MACHINE_LABEL, ""),
                deployment_label=i["labels"].get(DEPLOYMENT_LABEL, ""),
                status=str(i["status"]),
                zone=str(i["zone"]).rsplit("/", 1)[-1],
            )
            for i in self.fake.instances()
        ]

    def calls(self) -> int:
        return len(self.fake.requests)

    def create_calls(self) -> int:
        return len(self.fake.requests_of("insert"))

    def destroy_requested(self, machine_id: str) -> bool:
        name = instance_name(machine_id)
        return any(r.path.rsplit("/", 1)[-1] == name for r in self.fake.requests_of("delete"))

    def stockout(self, zone: str) -> None:
        self.fake.set_stockout(zone)

    def stockout_on_start(self, zone: str) -> None:
        # A GCE zone out of GPUs refuses starts as it refuses inserts.
        self.fake.set_stockout(zone)

    def exceed_quota(self) -> None:
        self.fake.set_gpu_quota(self.region, 0)

    def lift_quota(self) -> None:
        self.fake.set_gpu_quota(self.region, 64)

    def refuse_credentials(self) -> None:
        # GCE refuses a bad credential on every call, whatever the region, until it is fixed.
        self.fake.refuse_credentials(401)

    def accept_credentials(self) -> None:
        self.fake.refuse_credentials(0)

    def lose_next_create_answer(self) -> None:
        self.fake.drop_next_response("insert")

    def preempt(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        self.fake.preempt(inst.zone, instance_name(machine_id))

    def restart_by_itself(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        with self.fake.state.lock:
            found = self.fake.state.instance(inst.zone, instance_name(machine_id))
            found.status, found.phases = "RUNNING", []
            found.last_start = self.fake.state.clock.now()

    def shows_preempted_stop(self, machine_id: str) -> bool:
        # GCE: TERMINATED (stopped, disk kept) with its lastStopTimestamp, on a SPOT
        # instance whose termination action is STOP.
        (raw,) = [i for i in self.fake.instances() if i["name"] == instance_name(machine_id)]
        scheduling = raw.get("scheduling") or {}
        return bool(
            raw["status"] == "TERMINATED"
            and raw.get("lastStopTimestamp")
            and scheduling.get("provisioningModel") == "SPOT"
            and scheduling.get("instanceTerminationAction") == "STOP"
        )

    def lag_lists(self) -> None:
        self.fake.lag_lists()

    def catch_up(self) -> None:
        self.fake.catch_up_lists()

    def vanish(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        with self.fake.state.lock:
            del self.fake.state.instances[(inst.zone, instance_name(machine_id))]

    def end_slowly(self) -> None:
        self.fake.hang_operations("delete")

    def finish_ending(self) -> None:
        self.fake.finish_operations("delete")

    def hold_destroy(self, machine_id: str) -> None:
        self.fake.hold_deletes_of(instance_name(machine_id))

    def release_destroys(self) -> None:
        self.fake.release_deletes()

    def plant(self, machine_id: str, deployment_id: str, zone: str) -> str:
        made = self.fake.plant(
            zone,
            instance_name(machine_id),
            {DEPLOYMENT_LABEL: deployment_id, MACHINE_LABEL: machine_id},
            machine_type=self.instance_type,
        )
        return str(made["id"])


class AwsCloud:
    name = "aws"
    provider = Provider.AWS
    region = "us-east-1"
    zones = ("us-east-1a", "us-east-1b")
    instance_type = "g6.xlarge"  # one L4

    def __init__(self, moto: MotoServer, faults: Ec2Faults) -> None:
        self.moto = moto
        self.faults = faults

    def driver(self, deployment_id: str, clock: Clock) -> Driver:
        # The driver's seam: its Ec2Clients carry the fault hooks on every client they build.
        return aws_driver_for(self.moto, self.faults, deployment_id, regions=(self.region,))

    def _raw(self, *, alive: bool) -> list[dict[str, Any]]:
        return self.moto.instances(self.region, alive=alive)

    def live(self) -> list[Seen]:
        out = []
        ending = self.faults.shutting_down()
        for raw in self._raw(alive=True):
            tags = {t["Key"]: t.get("Value", "") for t in raw.get("Tags") or []}
            out.append(
                Seen(
                    provider_instance_id=str(raw["InstanceId"]),
                    machine_label=tags.get(MACHINE_LABEL, ""),
                    deployment_label=tags.get(DEPLOYMENT_LABEL, ""),
                    status="shutting-down" if raw["InstanceId"] in ending else str(raw["State"]["Name"]),
                    zone=str(raw["Placement"]["AvailabilityZone"]),
                )
            )
        return out

    def calls(self) -> int:
        return len(self.faults.calls)

    def create_calls(self) -> int:
        return len(self.faults.calls_of("RunInstances"))

    def destroy_requested(self, machine_id: str) -> bool:
        ids = {
            str(raw["InstanceId"])
            for raw in self._raw(alive=False)
            if {"Key": MACHINE_LABEL, "Value": machine_id} in (raw.get("Tags") or [])
        }
        asked = {i for c in self.faults.calls_of("TerminateInstances") for i in c.params["InstanceIds"]}
        return bool(ids & asked)

    def stockout(self, zone: str) -> None:
        self.faults.stockout(zone)

    def stockout_on_start(self, zone: str) -> None:
        # EC2 answers a start it has no capacity for with InsufficientInstanceCapacity (500).
        self.faults.fail_next(
            ErrorAnswer("InsufficientInstanceCapacity", 500), "StartInstances", region=self.region, times=10
        )

    def exceed_quota(self) -> None:
        # EC2 answers the vCPU limit on RunInstances itself (the adopt lookup before it passes).
        self.faults.fail_next(ErrorAnswer("VcpuLimitExceeded", 400), "RunInstances", region=self.region)

    def lift_quota(self) -> None:
        """The scripted refusal was for one call only: nothing is left to lift."""

    def refuse_credentials(self) -> None:
        self.faults.fail_next(ErrorAnswer("AuthFailure", 401), region=self.region)

    def accept_credentials(self) -> None:
        """The scripted refusal was for one call only: nothing is left to restore."""

    def lose_next_create_answer(self) -> None:
        self.faults.lose_next_answer("RunInstances")

    def preempt(self, machine_id: str) -> None:
        # A spot interruption with stop behaviour is EC2 stopping the instance itself; done
        # through a plain client of the test, so it is not among the platform's calls.
        (inst,) = labelled(self, machine_id)
        self.moto.client(self.region).stop_instances(InstanceIds=[inst.provider_instance_id])
        # moto has no spot interruption and records every stop as the user's
        # (Client.UserInitiatedShutdown); EC2 says why it stopped the instance, and the
        # platform's clients are shown that.
        self.faults.describe_with(
            inst.provider_instance_id,
            StateReason={
                "Code": "Server.SpotInstanceTermination",
                "Message": "Server.SpotInstanceTermination: Spot instance termination",
            },
        )

    def restart_by_itself(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        self.moto.client(self.region).start_instances(InstanceIds=[inst.provider_instance_id])
        self.faults.describe_with(inst.provider_instance_id)  # running: no StateReason

    def shows_preempted_stop(self, machine_id: str) -> bool:
        # EC2: stopped, its StateReason the spot service's, read through a client carrying
        # the same hooks as the platform's.
        client = self.moto.client(self.region)
        self.faults.attach(self.region, client)
        pages = client.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{MACHINE_LABEL}", "Values": [machine_id]}]
        )
        (raw,) = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return bool(
            raw["State"]["Name"] == "stopped"
            and raw.get("InstanceLifecycle") == "spot"
            and (raw.get("StateReason") or {}).get("Code") == "Server.SpotInstanceTermination"
        )

    def lag_lists(self) -> None:
        self.faults.lag_describe()

    def catch_up(self) -> None:
        self.faults.catch_up()

    def vanish(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        self.moto.client(self.region).terminate_instances(InstanceIds=[inst.provider_instance_id])

    def end_slowly(self) -> None:
        self.faults.terminate_slowly()

    def finish_ending(self) -> None:
        ids = self.faults.finish_terminations()
        if ids:
            self.moto.client(self.region).terminate_instances(InstanceIds=ids)

    def hold_destroy(self, machine_id: str) -> None:
        (inst,) = labelled(self, machine_id)
        self.faults.hold_terminations_of(inst.provider_instance_id)

    def release_destroys(self) -> None:
        self.faults.release_terminations()

    def plant(self, machine_id: str, deployment_id: str, zone: str) -> str:
        tags = [
            {"Key": DEPLOYMENT_LABEL, "Value": deployment_id},
            {"Key": MACHINE_LABEL, "Value": machine_id},
        ]
        answer = self.moto.client(self.region).run_instances(
            ImageId=self.moto.image(self.region),
            InstanceType=self.instance_type,
            MinCount=1,
            MaxCount=1,
            Placement={"AvailabilityZone": zone},
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        return str(answer["Instances"][0]["InstanceId"])
