"""The one place where the testbed's Kubernetes and etcd versions are pinned.

Both come from the Go module proxy by module name. The Kubernetes pin picks the
staging modules (``k8s.io/X v0.<minor>.<patch>``) and the Go language level of the
throwaway build module, so everything else derives from these two strings.
"""

from __future__ import annotations

KUBERNETES_VERSION = "1.36.4"
"""kube-apiserver release built from ``k8s.io/kubernetes``."""

ETCD_VERSION = "3.6.16"
"""etcd release built from ``go.etcd.io/etcd/server/v3`` (3.6.x pairs with 1.36)."""

KWOK_VERSION = "0.8.0"
"""kwok release built from ``sigs.k8s.io/kwok`` (0.8 is built against Kubernetes 1.36 libraries)."""

GO_LANGUAGE = "1.26.0"
"""The ``go`` line of Kubernetes 1.36's go.mod; the build module copies it so the
binary gets upstream's GODEBUG defaults rather than those of the local toolchain."""


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """Map a Kubernetes release (1.36.4) to its staging module version (v0.36.4)."""
    major, minor, patch = kubernetes_version.split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes_version!r}")
    return f"v0.{minor}.{patch}"
