"""MCRUNTIME_* settings reach every controller and provider cluster of a manager (no cluster needed)."""

from __future__ import annotations

import pytest

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def _noop(_request: mcr.Request) -> None:
    return None


def test_builder_defaults_come_from_the_managers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_MAX_CONCURRENT_RECONCILES", "3")
    monkeypatch.setenv("MCRUNTIME_MAX_TOTAL_RECONCILES", "40")
    monkeypatch.setenv("MCRUNTIME_CACHE_SYNC_TIMEOUT", "7")
    monkeypatch.setenv("MCRUNTIME_KEYS_PER_TURN", "5")
    provider = mcr.StaticProvider()
    manager = mcr.Manager.from_settings(
        provider, settings=mcr.ManagerSettings.load(metrics_bind_address="", health_probe_bind_address="")
    )
    defaulted = mcr.controller_managed_by(manager).named("defaulted").for_(CONFIGMAP).complete(_noop)
    assert (defaulted.max_concurrent_reconciles, defaulted.max_total_reconciles) == (3, 40)
    assert defaulted.queue.group_limit == 3
    assert (defaulted.keys_per_turn, defaulted.queue.keys_per_turn) == (5, 5)
    assert defaulted._cache_sync_timeout == 7
    chosen = (
        mcr.controller_managed_by(manager)
        .named("chosen")
        .for_(CONFIGMAP)
        .with_options(
            max_concurrent_reconciles=2, max_total_reconciles=5, cache_sync_timeout=9, keys_per_turn=1
        )
        .complete(_noop)
    )
    assert chosen.queue.keys_per_turn == 1
    assert (chosen.max_concurrent_reconciles, chosen.max_total_reconciles, chosen._cache_sync_timeout) == (
        2,
        5,
        9,
    )
    # The provider's clusters sync with the configured timeout too, not only the local cluster.
    assert provider.clusters.options.cache_sync_timeout == 7


def test_a_provider_timeout_chosen_explicitly_is_kept() -> None:
    provider = mcr.StaticProvider(options=mcr.ClusterOptions(cache_sync_timeout=11))
    mcr.Manager.from_settings(
        provider,
        settings=mcr.ManagerSettings.load(
            cache_sync_timeout=7, metrics_bind_address="", health_probe_bind_address=""
        ),
    )
    assert provider.clusters.options.cache_sync_timeout == 11


def test_without_settings_the_builder_uses_lanes_of_one_under_256() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    controller = mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    assert (controller.max_concurrent_reconciles, controller.max_total_reconciles) == (1, 256)
    assert controller.queue.keys_per_turn == 32


def test_a_bad_turn_is_named_by_the_builder_the_controller_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    with pytest.raises(mcr.BuilderError, match="keys_per_turn must be at least 1, not 0"):
        mcr.controller_managed_by(manager).for_(CONFIGMAP).with_options(keys_per_turn=0).complete(_noop)
    with pytest.raises(ValueError, match="controller 'bad': keys_per_turn must be at least 1, not -1"):
        mcr.Controller("bad", _noop, keys_per_turn=-1)
    monkeypatch.setenv("MCRUNTIME_KEYS_PER_TURN", "0")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_KEYS_PER_TURN"):
        mcr.ManagerSettings.load()


def test_a_bad_total_is_named_by_the_builder_and_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    with pytest.raises(mcr.BuilderError, match="max_total_reconciles must be at least 1, not 0"):
        mcr.controller_managed_by(manager).for_(CONFIGMAP).with_options(max_total_reconciles=0).complete(
            _noop
        )
    monkeypatch.setenv("MCRUNTIME_MAX_TOTAL_RECONCILES", "-2")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_MAX_TOTAL_RECONCILES"):
        mcr.ManagerSettings.load()
