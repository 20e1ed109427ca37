"""The gcp driver built from the provisioner's settings, and what it refuses before any call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from google.cloud import compute_v1

from gpufleet.common.clock import ManualClock
from gpufleet.common.errors import InvalidArgument
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    InstanceSpec,
    Offering,
    Provider,
)
from gpufleet.provisioner.drivers.factory import build_drivers
from gpufleet.provisioner.drivers.gcp import GcpClients, GcpDriver, GcpOptions
from gpufleet.provisioner.drivers.gcp_instances import Recipe
from gpufleet.provisioner.settings import Settings

EMULATOR = {
    "gcp_project": "p-1",
    "gcp_image": "projects/i/global/images/family/f",
    "gcp_api_endpoint": "http://127.0.0.1:9",
    "gcp_anonymous_credentials": True,
}


def test_environment_settings_reach_the_gcp_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "GPUFLEET_DRIVERS": "gcp",
        "GPUFLEET_DEPLOYMENT_ID": "dep-1",
        "GPUFLEET_GCP_PROJECT": "p-1",
        "GPUFLEET_GCP_ZONES": "us-central1-a, europe-west4-a",
        "GPUFLEET_GCP_IMAGE": "projects/i/global/images/family/f",
        "GPUFLEET_GCP_API_ENDPOINT": "http://127.0.0.1:9",
        "GPUFLEET_GCP_ANONYMOUS_CREDENTIALS": "true",
        "GPUFLEET_GCP_OPERATION_WAIT_S": "45",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.gcp_zones == ["us-central1-a", "europe-west4-a"]
    driver = build_drivers(settings, ManualClock())[Provider.GCP]
    assert (driver.provider, driver.deployment_id) == (Provider.GCP, "dep-1")
    inner = driver.inner  # type: ignore[attr-defined]
    assert isinstance(inner, GcpDriver)
    assert inner.options.zones == ("us-central1-a", "europe-west4-a")
    assert inner.options.operation_wait_s == 45


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"gcp_project": ""}, "GPUFLEET_GCP_PROJECT"),
        ({"gcp_image": ""}, "GPUFLEET_GCP_IMAGE"),
        ({"gcp_api_endpoint": None}, "GPUFLEET_GCP_API_ENDPOINT"),  # anonymous only against an emulator
    ],
)
def test_a_gcp_driver_that_cannot_work_fails_at_start(override: dict[str, Any], complaint: str) -> None:
    settings = Settings(drivers=[Provider.GCP], **{**EMULATOR, **override})
    with pytest.raises(ValueError, match=complaint):
        build_drivers(settings, ManualClock())


def test_no_setting_carries_a_credential() -> None:
    fields = [name for name in Settings.model_fields if name.startswith("gcp_")]
    assert not [
        f for f in fields if any(word in f for word in ("key", "secret", "token", "password", "json"))
    ]


@dataclass
class StubInstances:
    """An instances client whose aggregatedList returns what the server-side filter let slip."""

    pages: list[dict[str, compute_v1.InstancesScopedList]]
    calls: list[str] = field(default_factory=list)

    def aggregated_list(self, request: Any, retry: Any, timeout: float) -> Any:
        self.calls.append(request.filter)
        return [item for page in self.pages for item in page.items()]

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call {name}")


def _inst(name: str, labels: dict[str, str]) -> compute_v1.Instance:
    return compute_v1.Instance(
        id=1,
        name=name,
        status="RUNNING",
        zone="zones/us-central1-a",
        machine_type="x/g2-standard-8",
        labels=labels,
    )


def _driver(instances: Any, zones: tuple[str, ...] = ()) -> GcpDriver:
    clients = GcpClients(instances=instances, operations=None)
    options = GcpOptions(project="p-1", recipe=Recipe(image="img"), zones=zones)
    return GcpDriver(clients, "dep-1", ManualClock(), options)


def test_list_keeps_only_our_deployment_whatever_the_server_returned() -> None:
    stub = StubInstances(
        [
            {
                "zones/us-central1-a": compute_v1.InstancesScopedList(
                    instances=[
                        _inst("gf-a", {DEPLOYMENT_LABEL: "dep-1", MACHINE_LABEL: "a"}),
                        _inst("gf-b", {DEPLOYMENT_LABEL: "dep-10", MACHINE_LABEL: "b"}),
                        _inst("console-vm", {}),
                    ]
                )
            }
        ]
    )
    assert [i.machine_id for i in _driver(stub).list()] == ["a"]
    assert stub.calls == [f'(labels.{DEPLOYMENT_LABEL} = "dep-1")']


@pytest.mark.parametrize(
    ("offering", "field_name"),
    [
        (
            Offering(Provider.GCP, "us-central1", "us-central1-a", "n1-standard-8", 1),
            "offering.instance_type",
        ),
        (
            Offering(Provider.GCP, "us-central1", "us-central1-a", "g2-standard-48", 1, gpu_count=1),
            "offering.gpu_count",
        ),
        (Offering(Provider.GCP, "asia-east1", "asia-east1-c", "g2-standard-8", 1), "offering.zone"),
    ],
)
def test_create_refuses_what_this_provisioner_does_not_buy_before_calling_gce(
    offering: Offering, field_name: str
) -> None:
    driver = _driver(StubInstances([]), zones=("us-central1-a",))
    with pytest.raises(InvalidArgument) as raised:
        driver.create(InstanceSpec("m-1", offering))
    assert raised.value.field == field_name


def test_a_deployment_id_that_is_no_label_value_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        GcpDriver(GcpClients(None, None), "Dep One", ManualClock(), GcpOptions("p", Recipe(image="i")))
