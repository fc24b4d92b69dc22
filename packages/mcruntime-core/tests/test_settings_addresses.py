"""Bind addresses and timings in ``ManagerSettings``: refused at load when they could not work, and
two spellings of one socket served by one server."""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket

import pytest
from prometheus_client import CollectorRegistry

import mcruntime as mcr
from mcruntime._manager.serving import EVERY_INTERFACE, Checks, Endpoints, bind_key, parse_address
from mcruntime._manager.settings import MAX_SECONDS
from mcruntime.testing._net import free_port, http_get

ADDRESS_FIELDS = ("metrics_bind_address", "health_probe_bind_address", "webhook_bind_address")
SECONDS_FIELDS = (
    "lease_duration",
    "renew_deadline",
    "retry_period",
    "cache_sync_timeout",
    "graceful_shutdown_timeout",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MCRUNTIME_"):
            monkeypatch.delenv(name)


def _load(field: str, value: str) -> mcr.ManagerSettings:
    # The other endpoints off, so no address clashes with the one under test.
    others = {name: "" for name in ADDRESS_FIELDS if name != field}
    return mcr.ManagerSettings.load(**others, **{field: value})


@pytest.mark.parametrize("field", ADDRESS_FIELDS)
@pytest.mark.parametrize(
    "address", [":8081", "0.0.0.0:8081", "127.0.0.1:0", "localhost:8081", "[::1]:8081", "[::]:8081", ""]
)
def test_accepted_addresses_are_kept_as_written(field: str, address: str) -> None:
    assert getattr(_load(field, address), field) == address


@pytest.mark.parametrize("field", ADDRESS_FIELDS)
@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("localhost", "expected host:port, :port or [IPv6]:port, with a port of 0-65535"),
        (":99999", "with a port of 0-65535"),
        (":-1", "expected host:port"),
        (":", "expected host:port"),
        ("host:http", "expected host:port"),
        ("::1:8080", "an IPv6 host goes in brackets, as in [::1]:8080"),
        ("[::1:8080", "an IPv6 host goes in brackets"),
        ("[not-v6]:8080", "[not-v6] is not an IPv6 address in brackets"),
        ("my host:8080", "'my host' is not a host name or IP address"),
    ],
)
def test_a_malformed_address_is_refused_naming_the_variable_and_value(
    field: str, address: str, why: str
) -> None:
    variable = f"MCRUNTIME_{field.upper()}"
    with pytest.raises(
        mcr.SettingsError, match=re.escape(f"{variable}={address!r}: ") + ".*" + re.escape(why)
    ):
        _load(field, address)


def test_an_address_refused_says_how_an_endpoint_is_turned_off() -> None:
    # controller-runtime turns /metrics off with "0"; here that is empty, and the error says so.
    with pytest.raises(mcr.SettingsError, match="empty disables"):
        _load("metrics_bind_address", "0")


def test_a_bracketed_ipv6_address_reaches_the_webhook_server_as_it_binds() -> None:
    options = _load("webhook_bind_address", "[::1]:9443").webhook_options()
    assert options is not None
    assert (options.listen_host, options.listen_port) == ("::1", 9443)


@pytest.mark.parametrize(
    ("address", "key"),
    [
        (":8080", (EVERY_INTERFACE, 8080)),
        ("0.0.0.0:8080", (EVERY_INTERFACE, 8080)),
        ("[::]:8080", ("::", 8080)),
        ("[0:0::1]:8080", ("::1", 8080)),
        ("LocalHost:8080", ("localhost", 8080)),
    ],
)
def test_spellings_of_one_socket_have_one_key(address: str, key: tuple[str, int]) -> None:
    assert bind_key(address) == key


def test_the_parser_takes_the_brackets_off() -> None:
    assert parse_address("[::1]:18610") == ("::1", 18610)
    assert parse_address(":18610") == ("", 18610)


def test_the_webhook_clashes_with_a_probe_spelled_differently() -> None:
    with pytest.raises(mcr.SettingsError, match="are the same port"):
        mcr.ManagerSettings.load(
            webhook_bind_address="LocalHost:9443",
            health_probe_bind_address="localhost:9443",
            metrics_bind_address="",
        )


def test_a_clash_with_a_default_address_says_it_is_the_default_and_names_no_field_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS", raising=False)
    with pytest.raises(mcr.SettingsError) as clash:
        mcr.ManagerSettings.load(webhook_bind_address=":8081", metrics_bind_address="")
    assert str(clash.value) == (
        "invalid manager settings: MCRUNTIME_WEBHOOK_BIND_ADDRESS ':8081' and "
        "MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS ':8081' (its default) are the same port: "
        "the webhook server needs one of its own"
    )
    monkeypatch.setenv("MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS", ":8081")  # set, to the default's value
    with pytest.raises(mcr.SettingsError) as clash:
        mcr.ManagerSettings.load(webhook_bind_address=":8081", metrics_bind_address="")
    assert "(its default)" not in str(clash.value)


async def test_probes_and_metrics_on_two_spellings_of_one_address_share_a_server() -> None:
    port = free_port()
    endpoints = Endpoints(Checks(), Checks(), CollectorRegistry())
    await endpoints.start(probes=f":{port}", metrics=f"0.0.0.0:{port}")
    try:
        for path in ("/healthz", "/metrics"):
            answer = await asyncio.to_thread(http_get, port, path)
            assert answer is not None and answer[0] == 200, path
        assert endpoints.addresses["/healthz"] == endpoints.addresses["/metrics"]
    finally:
        await endpoints.stop()


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_address_binds_without_its_brackets() -> None:
    endpoints = Endpoints(Checks(), Checks(), CollectorRegistry())
    await endpoints.start(probes="[::1]:0", metrics=None)
    try:
        host, _port = endpoints.addresses["/healthz"]
        assert host == "::1"
        assert endpoints.url("/healthz").startswith("http://[::1]:")
    finally:
        await endpoints.stop()


async def test_a_malformed_address_given_to_a_manager_by_hand_names_the_endpoint() -> None:
    endpoints = Endpoints(Checks(), Checks(), CollectorRegistry())
    with pytest.raises(ValueError, match="cannot serve /healthz, /readyz on 'localhost': expected host:port"):
        await endpoints.start(probes="localhost", metrics=None)


@pytest.mark.parametrize("field", SECONDS_FIELDS)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("inf", "Input should be a finite number"),
        ("nan", "Input should be a finite number"),
        ("1e300", f"Input should be less than or equal to {MAX_SECONDS:.0f}"),
        (str(MAX_SECONDS + 1), f"Input should be less than or equal to {MAX_SECONDS:.0f}"),
    ],
)
def test_a_timing_must_be_finite_and_at_most_a_day(field: str, value: str, why: str) -> None:
    with pytest.raises(mcr.SettingsError, match=f"MCRUNTIME_{field.upper()}='{value}': {why}"):
        mcr.ManagerSettings.load(**{field: value})


@pytest.mark.parametrize("field", SECONDS_FIELDS)
def test_a_day_is_still_a_timing(field: str) -> None:
    assert getattr(mcr.ManagerSettings.load(**{field: MAX_SECONDS}), field) == MAX_SECONDS


@pytest.mark.parametrize("field", ["shard_weight", "ready_min_share"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_the_other_float_settings_are_finite_too(field: str, value: float) -> None:
    with pytest.raises(mcr.SettingsError, match=f"MCRUNTIME_{field.upper()}=.*finite"):
        mcr.ManagerSettings.load(**{field: value})
