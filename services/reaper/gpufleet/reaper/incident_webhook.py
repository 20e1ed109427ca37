"""What the incident webhook posts, and how: the message for an incident opened or resolved
(Alertmanager's webhook shape, or Slack's), and one delivery with bounded retries.

Only the standard library: the reaper pins no HTTP client, and one JSON POST needs none.
An ``https`` URL is verified against the system's trust store (a webhook receiver is an
outside service with a public certificate, never the deployment's own CA). Redirects are
refused rather than followed: urllib would turn a redirected POST into a GET without its
body and report success for a message that never arrived.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)

ALERTNAME = "GpufleetIncident"
# Alertmanager writes this for an alert that has not ended.
_NOT_ENDED = "0001-01-01T00:00:00Z"


class WebhookFormat(enum.StrEnum):
    ALERTMANAGER = "alertmanager"
    SLACK = "slack"


class Status(enum.StrEnum):
    """Alertmanager's words for an alert that starts and one that ends."""

    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class IncidentChange:
    """An incident opened (``FIRING``) or resolved, as read from the incidents table."""

    incident_id: int
    failure_class: str
    status: Status
    summary: str
    opened_at: datetime
    resolved_at: datetime | None
    machine_id: str | None = None
    job_id: str | None = None

    @property
    def happened_at(self) -> datetime:
        """When the change itself happened: the order changes are posted in."""
        if self.status is Status.RESOLVED and self.resolved_at is not None:
            return self.resolved_at
        return self.opened_at


@dataclass(frozen=True)
class WebhookPolicy:
    """Where and how to post. Durations are real seconds: they wait on a real server."""

    url: str
    format: WebhookFormat = WebhookFormat.ALERTMANAGER
    timeout_s: float = 5.0
    # Tries per message, the first included; waits between them double from backoff_s.
    attempts: int = 4
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0


def message(change: IncidentChange, fmt: WebhookFormat) -> dict[str, Any]:
    """The JSON body for ``change`` in ``fmt``."""
    if fmt is WebhookFormat.SLACK:
        return {"text": _slack_text(change)}
    return _alertmanager(change)


def _alertmanager(change: IncidentChange) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) carrying one alert, so any receiver written
    for Alertmanager (a pager's integration, an incident bot) takes it as it is. The labels
    name the incident, so a receiver that deduplicates by labels pairs its resolve with its
    firing."""
    labels = {
        "alertname": ALERTNAME,
        "failure_class": change.failure_class,
        "incident_id": str(change.incident_id),
    }
    annotations = {"summary": _summary(change)}
    if change.machine_id:
        annotations["machine_id"] = change.machine_id
    if change.job_id:
        annotations["job_id"] = change.job_id
    ended = change.resolved_at if change.status is Status.RESOLVED else None
    alert = {
        "status": change.status.value,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _rfc3339(change.opened_at),
        "endsAt": _rfc3339(ended) if ended is not None else _NOT_ENDED,
        "generatorURL": "",
        "fingerprint": _fingerprint(labels),
    }
    group_labels = {"alertname": ALERTNAME}
    return {
        "version": "4",
        "groupKey": '{}:{alertname="' + ALERTNAME + '"}',
        "truncatedAlerts": 0,
        "status": change.status.value,
        "receiver": "gpufleet",
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [alert],
    }


def _slack_text(change: IncidentChange) -> str:
    if change.status is Status.RESOLVED:
        return f":white_check_mark: gpufleet incident {change.incident_id} resolved: {_summary(change)}"
    return f":rotating_light: gpufleet incident {change.incident_id} opened: {_summary(change)}"


def _summary(change: IncidentChange) -> str:
    return f"{change.failure_class}: {change.summary}"


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _fingerprint(labels: dict[str, str]) -> str:
    text = "\xff".join(f"{k}\xff{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Delivery(enum.StrEnum):
    """How one message ended: the outcome label of ``gpufleet.incidents.notifications``,
    or ``STOPPED`` (the process is stopping mid-retry: not settled, posted again later)."""

    SENT = "sent"
    FAILED = "failed"
    STOPPED = "stopped"


class _Refused(Exception):
    """The receiver answered in a way another try will not change (a 4xx, a redirect)."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx surfaces as an HTTPError: refused, said in the log


class WebhookSender:
    """Posts messages to one URL, each retried with back-off up to ``attempts`` times.

    A try that times out, cannot connect, or is answered 5xx, 408 or 429 is tried again;
    any other non-2xx answer is final (the URL or the payload is wrong: trying again
    spends the retries for nothing). The waits are on ``stop``, so a stopping process
    does not sit out a back-off.
    """

    def __init__(self, policy: WebhookPolicy) -> None:
        self.policy = policy
        handlers: list[Any] = [_NoRedirects()]
        if policy.url.lower().startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context()))
        self._opener = urllib.request.build_opener(*handlers)

    def deliver(self, body: dict[str, Any], stop: threading.Event) -> Delivery:
        data = json.dumps(body).encode()
        wait = self.policy.backoff_s
        for attempt in range(1, self.policy.attempts + 1):
            try:
                self._post(data)
                return Delivery.SENT
            except _Refused as exc:
                log.warning("incident webhook refused the message: %s; not retried", exc)
                return Delivery.FAILED
            except (OSError, urllib.error.URLError) as exc:
                why = str(exc)
            if attempt == self.policy.attempts:
                log.warning("incident webhook: %d tries failed, the last: %s", attempt, why)
                return Delivery.FAILED
            log.info("incident webhook try %d failed (%s); again in %.1f s", attempt, why, wait)
            if stop.wait(wait):
                return Delivery.STOPPED
            wait = min(wait * 2, self.policy.backoff_max_s)
        return Delivery.FAILED

    def _post(self, data: bytes) -> None:
        request = urllib.request.Request(
            self.policy.url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "gpufleet-reaper"},
        )
        try:
            with self._opener.open(request, timeout=self.policy.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code >= 500 or exc.code in (408, 429):
                raise OSError(f"HTTP {exc.code}") from None
            raise _Refused(f"HTTP {exc.code}") from None
