"""The incident webhook's settings: off unless a URL is set, its URL a secret that only an
http(s) URL with a host passes, Alertmanager's shape unless told Slack's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.reaper.incident_webhook import WebhookFormat
from gpufleet.reaper.settings import Settings


def test_off_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().incident_webhook() is None
    monkeypatch.setenv("GPUFLEET_INCIDENT_WEBHOOK_URL", "")
    assert Settings().incident_webhook() is None


def test_the_environment_turns_it_on_alertmanager_shaped_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_INCIDENT_WEBHOOK_URL", "https://hooks.example.com/services/T0/B0/secret")
    monkeypatch.setenv("GPUFLEET_INCIDENT_WEBHOOK_POLL_S", "5")
    settings = Settings()
    webhook = settings.incident_webhook()
    assert webhook is not None
    post, look = webhook
    assert post.url == "https://hooks.example.com/services/T0/B0/secret"
    assert post.format is WebhookFormat.ALERTMANAGER
    assert (post.attempts, post.backoff_s, post.timeout_s) == (4, 1.0, 5.0)
    assert (look.poll_s, look.lookback_s) == (5.0, 600.0)
    # A Slack URL is its own credential: the settings never show it.
    assert "secret" not in repr(settings) and "secret" not in str(settings.model_dump())


def test_slack_shaped_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_INCIDENT_WEBHOOK_URL", "http://127.0.0.1:9/hook")
    monkeypatch.setenv("GPUFLEET_INCIDENT_WEBHOOK_FORMAT", "slack")
    webhook = Settings().incident_webhook()
    assert webhook is not None and webhook[0].format is WebhookFormat.SLACK


@pytest.mark.parametrize(
    "url", ["hooks.example.com/x", "ftp://hooks.example.com/x", "https:///x", "file:///etc/passwd"]
)
def test_only_an_http_url_with_a_host(url: str) -> None:
    with pytest.raises(ValidationError, match="incident_webhook_url"):
        Settings(incident_webhook_url=url)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValidationError, match="incident_webhook_format"):
        Settings(incident_webhook_url="http://127.0.0.1:9/hook", incident_webhook_format="teams")
