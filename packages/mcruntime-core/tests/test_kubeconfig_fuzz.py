"""Hostile kubeconfigs: every input gives a config or a KubeconfigError, in bounded time and memory.

Property-based: hypothesis builds documents from random structures, near-valid
kubeconfigs with wrong types in every field, YAML alias bombs, deep nesting and
huge strings; the loader must answer each within a time and a memory bound and
raise nothing but :class:`KubeconfigError`.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcruntime._base.errors import KubeconfigError
from mcruntime._config.bounded_yaml import DEFAULT_MAX_BYTES
from mcruntime._config.kubeconfig import (
    ClusterConfig,
    TrustPolicy,
    kubeconfig_from_dict,
    kubeconfig_from_yaml,
    load_kubeconfig,
)

CALL_BOUND = (
    200_000  # calls per document (Python's and C's; the most seen is about 2,400): no load changes it
)
MEMORY_BOUND = 64 * 1024 * 1024  # bytes of peak Python allocation per document

FUZZ = settings(
    max_examples=150,
    deadline=None,  # bounded below by counting calls, which a loaded machine cannot make flaky
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        ["https://h:6443", "http://h", "https://u:p@h", "ftp://h", "~nobody/x", "a\x00b", "/", ""]
    ),
    st.builds(lambda n: "x" * n, st.integers(0, 200_000)),  # huge strings
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

FIELDS = {
    "cluster": ["server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                "tls-server-name", "proxy-url"],
    "user": ["token", "tokenFile", "username", "password", "client-certificate", "client-key",
             "client-certificate-data", "client-key-data", "exec", "auth-provider"],
    "context": ["cluster", "user", "namespace"],
}  # fmt: skip


def valid() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://h:6443"}}],
        "users": [{"name": "u", "user": {"token": "made-up"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid kubeconfig with a few random fields replaced by random values."""
    document = valid()
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["top", "cluster", "user", "context", "section", "item"]))
        value = draw(values)
        if where == "top":
            document[draw(st.sampled_from(["clusters", "users", "contexts", "current-context"]))] = value
        elif where == "section":
            section = draw(st.sampled_from(["clusters", "users", "contexts"]))
            if isinstance(document.get(section), list):
                document[section].append(value)
        elif where == "item":
            section = draw(st.sampled_from(["clusters", "users", "contexts"]))
            items = document.get(section)
            if isinstance(items, list) and items and isinstance(items[0], dict):
                items[0][draw(st.sampled_from(["name", section.rstrip("s")]))] = value
        else:
            section = {"cluster": "clusters", "user": "users", "context": "contexts"}[where]
            items = document.get(section)
            if isinstance(items, list) and items and isinstance(items[0], dict):
                entry = items[0].get(where)
                if isinstance(entry, dict):
                    entry[draw(st.sampled_from(FIELDS[where]))] = value
    return document


def alias_bomb(levels: int, width: int) -> str:
    """The "billion laughs": each level refers to the one before ``width`` times."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append(f"clusters: [{{name: c, cluster: {{server: https://h, extensions: *a{levels}}}}}]")
    return "\n".join(lines) + "\n"


def bounded(load: Callable[[], ClusterConfig]) -> None:
    """Run ``load`` and check the contract: a config or a KubeconfigError, cheap and small.

    Cheap is counted in function calls, not seconds: the alias bomb that once took 15 s
    made tens of millions of them, and a count is the same on a loaded machine as on an
    idle one.
    """
    calls = 0

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    tracemalloc.start()
    outcome: object
    sys.setprofile(count)
    try:
        outcome = load()
    except KubeconfigError as error:
        outcome = error
    finally:
        sys.setprofile(None)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    if isinstance(outcome, ClusterConfig):
        assert len(outcome.fingerprint()) == 64
        assert outcome.origin in repr(outcome)
    else:
        assert isinstance(outcome, KubeconfigError) and str(outcome)
    assert calls < CALL_BOUND, f"made {calls} calls"
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.1f} MiB"


@FUZZ
@given(document=st.one_of(values, near_valid()))
def test_any_document_gives_a_config_or_a_kubeconfig_error(document: Any) -> None:
    bounded(lambda: kubeconfig_from_dict(document, trust=TrustPolicy.own(), base_dir="/"))


@settings(FUZZ, max_examples=80)
@given(document=st.one_of(values, near_valid()), mangle=st.sampled_from(["none", "cut", "tab", "anchor"]))
def test_any_yaml_text_gives_a_config_or_a_kubeconfig_error(document: Any, mangle: str) -> None:
    text = yaml.safe_dump(document, width=80)
    if mangle == "cut":
        text = text[: len(text) // 2]
    elif mangle == "tab":
        text = text.replace("  ", "\t", 1)
    elif mangle == "anchor":
        text = "x: &a [1]\ny: *a\n" + text
    bounded(lambda: kubeconfig_from_yaml(text, trust=TrustPolicy.own(), base_dir="/"))


@FUZZ
@given(levels=st.integers(1, 12), width=st.integers(2, 10))
def test_alias_bombs_are_refused_at_once(levels: int, width: int) -> None:
    text = alias_bomb(levels, width)

    with pytest.raises(KubeconfigError, match="YAML aliases are not allowed"):
        kubeconfig_from_yaml(text, origin="bomb.yaml")
    bounded(lambda: kubeconfig_from_yaml(text, origin="bomb.yaml"))


def test_the_alias_bomb_that_took_15_seconds_is_refused_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9, 9))  # ~1.4 KB, 387 million leaves once expanded
    assert path.stat().st_size < 2000

    with pytest.raises(
        KubeconfigError, match=r"bomb\.yaml: not valid YAML at line 2: YAML aliases"
    ) as caught:
        load_kubeconfig(path)
    assert caught.value.origin == str(path)
    bounded(lambda: load_kubeconfig(path))


def test_a_shared_structure_built_in_memory_is_refused_without_walking_it() -> None:
    shared: list[Any] = ["lol"]
    for _ in range(40):
        shared = [shared, shared]  # 2**40 leaves, 41 objects
    document = valid()
    document["clusters"][0]["cluster"]["extensions"] = shared

    with pytest.raises(KubeconfigError, match=r"nested deeper than|more than 100000 values"):
        kubeconfig_from_dict(document)
    bounded(lambda: kubeconfig_from_dict(document))


def test_deep_nesting_is_refused_with_the_limit_named() -> None:
    text = "clusters: " + "[" * 200 + "]" * 200 + "\n"

    with pytest.raises(KubeconfigError, match="nested deeper than 32 levels"):
        kubeconfig_from_yaml(text, origin="deep.yaml")


def test_a_file_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:
        handle.write("clusters: []\n# " + "x" * (50 * 1024 * 1024) + "\n")

    with pytest.raises(
        KubeconfigError, match=f"huge.yaml: larger than the limit of {DEFAULT_MAX_BYTES} bytes"
    ):
        load_kubeconfig(path)
    bounded(lambda: load_kubeconfig(path))
    with pytest.raises(KubeconfigError, match="larger than the limit of 100 bytes"):
        load_kubeconfig(path, max_bytes=100)


def test_a_secret_value_over_the_size_limit_is_refused_naming_its_origin() -> None:
    text = yaml.safe_dump(valid()) + "# " + "x" * 2000 + "\n"

    with pytest.raises(KubeconfigError, match=r"Secret ns/kc: larger than the limit of 1000 bytes"):
        kubeconfig_from_yaml(text, origin="Secret ns/kc", max_bytes=1000)
    assert kubeconfig_from_yaml(text, origin="Secret ns/kc").server == "https://h:6443"
