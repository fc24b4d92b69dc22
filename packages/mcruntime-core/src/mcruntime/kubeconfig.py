"""Kubeconfig helpers beyond loading one: parse a document at bounded cost, list its contexts, find the files.

:func:`mcruntime.load_kubeconfig` and its siblings at the root load a
config; these are the pieces a provider or a tool needs around that.
"""

from __future__ import annotations

from ._config.bounded_yaml import parse_kubeconfig
from ._config.kubeconfig import kubeconfig_paths_from_env, list_contexts, load_kubeconfig_async

__all__ = ["kubeconfig_paths_from_env", "list_contexts", "load_kubeconfig_async", "parse_kubeconfig"]
