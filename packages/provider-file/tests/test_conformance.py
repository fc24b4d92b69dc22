"""KubeconfigFileProvider against the provider conformance suite, over two layouts.

1. Flat files: each cluster is one kubeconfig file, ``<name>.kubeconfig``,
   whose single context is named after the cluster, and the provider names
   clusters by context. That naming lets a second file claim a taken name, so
   the duplicate case runs too. Files are written the way careful writers do
   (a temporary file renamed over the target), so every case also exercises
   rename-over detection.
2. Secret volumes: each cluster is a directory laid out like a mounted Secret
   (a timestamped directory, a ``..data`` symlink swapped on every update, a
   visible ``kubeconfig`` symlink), found by a recursive search and named by
   the default ``file/context`` strategy, which cannot collide.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

import mcruntime as mcr
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
    Target,
    wait_until,
)
from mcruntime_file import KubeconfigFileProvider


def named(kubeconfig: dict[str, Any], context: str) -> dict[str, Any]:
    """The target's kubeconfig with its one context renamed (and current)."""
    kubeconfig["contexts"][0]["name"] = context
    kubeconfig["current-context"] = context
    return kubeconfig


class FileDriver(ProviderDriver):
    """Each cluster is a kubeconfig file in one directory, its context named after the cluster."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.provider: KubeconfigFileProvider | None = None
        self.written: dict[str, str | None] = {}  # path -> sha256 of the content (None: deleted)

    def build(self) -> mcr.Provider:
        self.provider = KubeconfigFileProvider(
            self.directory,
            naming="context",
            options=CLUSTER_OPTIONS,
            probe_interval=PROBE_INTERVAL,
            debounce=0.05,
            removal_delay=0.2,
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    def _write(self, file: str, content: bytes) -> None:
        path = self.directory / file
        temporary = self.directory / f".{file}.tmp"  # a dot entry: never read by the provider
        temporary.write_bytes(content)
        os.replace(temporary, path)
        self.written[str(path)] = hashlib.sha256(content).hexdigest()

    async def add(self, name: str, target: Target) -> None:
        self._write(f"{name}.kubeconfig", yaml.safe_dump(named(target.kubeconfig(), name)).encode())

    async def touch(self, name: str, target: Target) -> None:
        path = self.directory / f"{name}.kubeconfig"
        self._write(path.name, path.read_bytes())  # the same bytes, a new inode and mtime

    async def corrupt(self, name: str) -> None:
        self._write(f"{name}.kubeconfig", b"clusters: [unclosed\n")  # a bad edit: no YAML

    async def remove(self, name: str) -> None:
        path = self.directory / f"{name}.kubeconfig"
        path.unlink()
        self.written[str(path)] = None

    async def add_duplicate(self, name: str, target: Target) -> None:
        self._write(f"{name}-duplicate.kubeconfig", yaml.safe_dump(named(target.kubeconfig(), name)).encode())

    def duplicate_reported(self, name: str) -> bool:
        assert self.provider is not None
        sources = self.provider.sources().values()
        return any(source.cluster == name and "duplicate_of" in source.detail for source in sources)

    async def settle(self) -> None:
        provider = self.provider
        assert provider is not None

        def caught_up() -> bool:
            seen = provider.sources()
            for path, digest in self.written.items():
                status = seen.get(path)
                if (status.version if status is not None else None) != digest:
                    return False
                if status is not None and status.detail.get("removing"):
                    return False
            return True

        await wait_until(caught_up, what="the provider read every file written")


class TestKubeconfigFileProvider(ProviderConformance):
    @pytest.fixture
    def driver(self, tmp_path: Path) -> ProviderDriver:
        return FileDriver(tmp_path)


class SecretVolumeDriver(FileDriver):
    """Each cluster is a directory laid out by the kubelet's atomic writer, under one searched root."""

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "file/context names include the path, so two files cannot share one",
    }
    _stamps = itertools.count()

    def build(self) -> mcr.Provider:
        self.provider = KubeconfigFileProvider(
            [self.directory],
            recursive=True,
            options=CLUSTER_OPTIONS,
            probe_interval=PROBE_INTERVAL,
            debounce=0.05,
            removal_delay=0.2,
        )
        return self.provider

    def engaged_name(self, name: str) -> str:
        return f"{self.directory / name / 'kubeconfig'}/conformance"

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return super().status(self.engaged_name(name))

    def _publish(self, name: str, content: bytes) -> None:
        volume = self.directory / name
        volume.mkdir(exist_ok=True)
        previous = (volume / "..data").resolve() if (volume / "..data").is_symlink() else None
        version = volume / f"..2026_11_21_10_00_00.{next(self._stamps):09d}"
        version.mkdir()
        (version / "kubeconfig").write_bytes(content)
        staging = volume / "..data_tmp"
        staging.symlink_to(version.name)
        os.replace(staging, volume / "..data")
        if not (volume / "kubeconfig").is_symlink():
            (volume / "kubeconfig").symlink_to(Path("..data") / "kubeconfig")
        if previous is not None:
            shutil.rmtree(previous)
        self.written[str(volume / "kubeconfig")] = hashlib.sha256(content).hexdigest()

    async def add(self, name: str, target: Target) -> None:
        self._publish(name, yaml.safe_dump(target.kubeconfig()).encode())

    async def touch(self, name: str, target: Target) -> None:
        self._publish(name, (self.directory / name / "kubeconfig").read_bytes())

    async def remove(self, name: str) -> None:
        shutil.rmtree(self.directory / name)  # the volume is unmounted
        self.written[str(self.directory / name / "kubeconfig")] = None


class TestKubeconfigFileProviderOverSecretVolumes(ProviderConformance):
    @pytest.fixture
    def driver(self, tmp_path: Path) -> ProviderDriver:
        return SecretVolumeDriver(tmp_path)
