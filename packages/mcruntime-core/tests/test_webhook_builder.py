"""The webhook builder refuses wrong wiring at complete(), with a message saying what is wrong."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import mcruntime as mcr
from mcruntime.webhook import Webhooks

KIND = mcr.Kind("example.com/v1", "Test")


def manager() -> mcr.Manager:
    return mcr.Manager(mcr.StaticProvider({}), handle_signals=False)


async def allow(_req: mcr.AdmissionRequest) -> None:
    return None


def same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def test_a_webhook_needs_a_kind_and_something_to_serve() -> None:
    with pytest.raises(mcr.BuilderError, match=r"call for_\(kind\) first"):
        mcr.webhook_managed_by(manager()).with_validator(allow).complete()
    with pytest.raises(mcr.BuilderError, match="nothing to serve"):
        mcr.webhook_managed_by(manager()).for_(KIND).complete()


def plain_validator(_req: mcr.AdmissionRequest) -> None:
    return None


def plain_defaulter(req: mcr.AdmissionRequest) -> dict[str, Any] | None:
    return req.object


class AsyncCallable:
    async def __call__(self, _req: mcr.AdmissionRequest) -> None:
        return None


def test_a_plain_function_as_validator_or_defaulter_is_refused_at_complete() -> None:
    # Found by a review: a plain `def` passed complete(), then ran on the event loop at every
    # call (blocking every cluster's webhooks) and failed with "object NoneType can't be used
    # in 'await' expression".
    with pytest.raises(mcr.BuilderError) as raised:
        mcr.webhook_managed_by(manager()).for_(KIND).with_validator(
            plain_validator,  # type: ignore[arg-type]  # the mistake under test
        ).with_defaulter(
            plain_defaulter,  # type: ignore[arg-type]  # the mistake under test
        ).complete()
    message = str(raised.value)
    assert "the validator 'plain_validator' is a plain function: a validator is an `async def`" in message
    assert "the defaulter 'plain_defaulter' is a plain function" in message
    # What can be awaited passes: async functions, partials of them, async callables, and lambdas
    # returning a coroutine (a lambda cannot be told from a plain function: it gets the benefit).
    import functools

    async def checks(_req: mcr.AdmissionRequest, strict: bool) -> None:
        return None

    for validator in (allow, functools.partial(checks, strict=True), AsyncCallable(), lambda req: allow(req)):
        mcr.webhook_managed_by(manager()).for_(KIND).with_validator(validator).complete()


def test_a_conversion_missing_a_direction_is_refused() -> None:
    with pytest.raises(mcr.BuilderError, match=r"need both to_hub and from_hub"):
        mcr.webhook_managed_by(manager()).for_(KIND).with_conversion(
            hub="v1", to_hub={"v1alpha1": same}, from_hub={}
        ).complete()


def test_core_kinds_cannot_be_converted() -> None:
    with pytest.raises(mcr.BuilderError, match="only custom resources"):
        mcr.webhook_managed_by(manager()).for_(mcr.Kind("v1", "ConfigMap")).with_conversion(
            hub="v1", to_hub={"v2": same}, from_hub={"v2": same}
        ).complete()


def test_a_second_validator_for_a_kind_is_refused() -> None:
    mgr = manager()
    mcr.webhook_managed_by(mgr).for_(KIND).with_validator(allow).complete()
    with pytest.raises(mcr.BuilderError, match="already has a validator"):
        mcr.webhook_managed_by(mgr).for_(KIND).with_validator(allow).complete()


def test_bad_options_are_all_named() -> None:
    with pytest.raises(mcr.BuilderError) as raised:
        mcr.webhook_managed_by(manager()).for_(KIND).with_validator(allow).with_options(
            timeout_seconds=60,
            operations=["PATCH"],
            failure_policy="Maybe",  # type: ignore[arg-type]
        ).complete()
    message = str(raised.value)
    assert "timeout_seconds must be between 1 and 30, not 60" in message
    assert "operations must be some of" in message
    assert "failure_policy must be 'Fail' or 'Ignore'" in message


def test_the_completed_webhooks_say_what_was_registered() -> None:
    mgr = manager()
    done = mcr.webhook_managed_by(mgr).for_(KIND).with_validator(allow).complete()
    assert done == Webhooks(KIND, validating=True, mutating=False, converting=False)
    assert KIND in mgr.webhook.validators and mgr.webhook.has_handlers


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"address": "9443"}, "must be host:port"),
        ({"cert_file": "tls.crt"}, "cert_file and key_file together"),
        ({"cert_dir": "/x", "cert_file": "a", "key_file": "b"}, "cert_dir or cert_file/key_file"),
        ({"handler_timeout": 0}, "handler_timeout must be above 0"),
        ({"max_concurrent_per_cluster": 0}, "max_concurrent_per_cluster must be at least 1"),
        ({"max_streams_per_connection": 0}, "max_streams_per_connection must be between 1 and 65536, not 0"),
    ],
)
def test_bad_webhook_options_are_refused(options: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        mcr.WebhookOptions(**options)


def test_webhook_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_WEBHOOK_BIND_ADDRESS", "0.0.0.0:9443")
    monkeypatch.setenv("MCRUNTIME_WEBHOOK_URL_HOST", "webhook.example.com")
    options = mcr.ManagerSettings.load().webhook_options()
    assert options is not None
    assert (options.address, options.public_host()) == ("0.0.0.0:9443", "webhook.example.com")
    assert options.http2
    monkeypatch.setenv("MCRUNTIME_WEBHOOK_HTTP2", "false")
    options = mcr.ManagerSettings.load().webhook_options()
    assert options is not None and not options.http2
    monkeypatch.delenv("MCRUNTIME_WEBHOOK_BIND_ADDRESS")
    monkeypatch.delenv("MCRUNTIME_WEBHOOK_URL_HOST")
    only = mcr.ManagerSettings.load().webhook_options()
    assert only is not None and not only.http2, "HTTP/2 off alone is a webhook setting too"
    monkeypatch.setenv("MCRUNTIME_WEBHOOK_BIND_ADDRESS", "nonsense")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_WEBHOOK_BIND_ADDRESS"):
        mcr.ManagerSettings.load().webhook_options()


def test_a_manager_from_settings_gets_the_webhook_options() -> None:
    settings = mcr.ManagerSettings.load(webhook_bind_address="127.0.0.1:0", webhook_cert_dir="/certs")
    mgr = mcr.Manager.from_settings(mcr.StaticProvider({}), settings=settings, handle_signals=False)
    assert mgr.webhook.options.address == "127.0.0.1:0"
    assert mgr.webhook.options.files() is not None and not mgr.webhook.options.registers
    plain = mcr.Manager.from_settings(
        mcr.StaticProvider({}), settings=mcr.ManagerSettings.load(), handle_signals=False
    )
    assert plain.webhook.options == mcr.WebhookOptions()


@pytest.mark.parametrize(
    ("webhook", "other", "clash"),
    [
        ("127.0.0.1:9443", {"metrics_bind_address": ":9443"}, "MCRUNTIME_METRICS_BIND_ADDRESS ':9443'"),
        (":8081", {}, "MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS ':8081'"),
        ("127.0.0.1:8081", {"health_probe_bind_address": "127.0.0.2:8081"}, None),
        ("127.0.0.1:0", {"metrics_bind_address": "127.0.0.1:0"}, None),
    ],
    ids=["metrics-every-interface", "probes-default", "other-host", "port-0"],
)
def test_the_webhook_server_needs_a_port_of_its_own(
    webhook: str, other: dict[str, str], clash: str | None
) -> None:
    if clash is None:
        assert mcr.ManagerSettings.load(webhook_bind_address=webhook, **other).webhook_bind_address == webhook
        return
    with pytest.raises(mcr.SettingsError, match=f"MCRUNTIME_WEBHOOK_BIND_ADDRESS '{webhook}' and {clash}"):
        mcr.ManagerSettings.load(webhook_bind_address=webhook, **other)


async def test_an_endpoint_that_cannot_listen_names_its_paths_and_address() -> None:
    from mcruntime._manager.serving import Checks, Endpoints

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    endpoints = Endpoints(Checks(), Checks(), CollectorRegistry())
    try:
        with pytest.raises(OSError, match=f"cannot serve /metrics on {address}: .*address already in use"):
            await endpoints.start(probes="127.0.0.1:0", metrics=address)
    finally:
        await endpoints.stop()
        taken.close()
