"""JSON-shaped objects: models converted to the server's JSON, deep copies, object keys."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

from mcruntime._base.objects import json_copy, metadata, object_key, to_json_shape

CREATED = datetime.datetime(2024, 3, 1, 12, 30, 45, tzinfo=datetime.UTC)


# -- to_json_shape --------------------------------------------------------------------


def test_a_config_map_model_becomes_its_json_shape() -> None:
    config_map = client.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=client.V1ObjectMeta(
            name="settings",
            namespace="team-a",
            labels={"app": "web"},
            creation_timestamp=CREATED,
            resource_version="42",
        ),
        data={"mode": "fast", "replicas": "3"},
        binary_data=None,
    )

    assert to_json_shape(config_map) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "settings",
            "namespace": "team-a",
            "labels": {"app": "web"},
            "creationTimestamp": "2024-03-01T12:30:45Z",
            "resourceVersion": "42",
        },
        "data": {"mode": "fast", "replicas": "3"},
    }


def test_a_deployment_with_nested_models_becomes_camel_case_json() -> None:
    deployment = client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=client.V1ObjectMeta(name="web", namespace="team-a"),
        spec=client.V1DeploymentSpec(
            replicas=0,
            paused=False,
            selector=client.V1LabelSelector(match_labels={"app": "web"}),
            strategy=client.V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=client.V1RollingUpdateDeployment(max_surge="25%", max_unavailable=0),
            ),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "web"}),
                spec=client.V1PodSpec(
                    service_account_name="web",
                    containers=[
                        client.V1Container(
                            name="web",
                            image="registry.example/web:1.0",
                            image_pull_policy="IfNotPresent",
                            ports=[client.V1ContainerPort(container_port=8080, name="http")],
                            env=[client.V1EnvVar(name="MODE", value="fast")],
                            resources=client.V1ResourceRequirements(limits={"cpu": "500m"}),
                        )
                    ],
                ),
            ),
        ),
    )

    shaped = to_json_shape(deployment)

    assert shaped == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {
            "replicas": 0,
            "paused": False,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "serviceAccountName": "web",
                    "containers": [
                        {
                            "name": "web",
                            "image": "registry.example/web:1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "ports": [{"containerPort": 8080, "name": "http"}],
                            "env": [{"name": "MODE", "value": "fast"}],
                            "resources": {"limits": {"cpu": "500m"}},
                        }
                    ],
                },
            },
        },
    }
    assert "status" not in shaped  # None fields are dropped, falsy values are not


def test_attributes_renamed_in_python_get_their_json_name() -> None:
    shaped = to_json_shape(client.V1ListMeta(_continue="token-of-the-next-page", resource_version="7"))

    assert shaped == {"continue": "token-of-the-next-page", "resourceVersion": "7"}


def test_an_empty_list_and_an_empty_mapping_are_kept() -> None:
    shaped = to_json_shape(client.V1ObjectMeta(name="x", finalizers=[], annotations={}))

    assert shaped == {"name": "x", "finalizers": [], "annotations": {}}


def test_a_whole_second_datetime_is_rfc3339_in_utc() -> None:
    assert to_json_shape(CREATED) == "2024-03-01T12:30:45Z"


def test_a_datetime_in_another_zone_is_converted_to_utc() -> None:
    paris = datetime.timezone(datetime.timedelta(hours=2))

    assert to_json_shape(datetime.datetime(2024, 3, 1, 14, 30, 45, tzinfo=paris)) == "2024-03-01T12:30:45Z"


def test_a_naive_datetime_is_taken_as_utc() -> None:
    assert to_json_shape(datetime.datetime(2024, 3, 1, 12, 30, 45)) == "2024-03-01T12:30:45Z"


def test_microseconds_are_kept_as_the_server_requires_for_micro_time_fields() -> None:
    renewed = datetime.datetime(2024, 3, 1, 12, 30, 45, 123456, tzinfo=datetime.UTC)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader", namespace="kube-system"),
        spec=client.V1LeaseSpec(holder_identity="replica-1", renew_time=renewed, lease_duration_seconds=15),
    )

    shaped = to_json_shape(lease)

    assert shaped["spec"]["renewTime"] == "2024-03-01T12:30:45.123456Z"
    assert shaped["spec"]["leaseDurationSeconds"] == 15


def test_a_date_is_iso_formatted() -> None:
    assert to_json_shape(datetime.date(2024, 3, 1)) == "2024-03-01"


def test_plain_json_passes_through_and_tuples_become_lists() -> None:
    value = {"a": [1, 2.5, True, None, "s"], "b": (1, 2), 3: {"nested": ()}}

    assert to_json_shape(value) == {"a": [1, 2.5, True, None, "s"], "b": [1, 2], "3": {"nested": []}}


def test_models_nested_in_plain_dicts_and_lists_are_converted() -> None:
    patch = {
        "metadata": client.V1ObjectMeta(labels={"app": "web"}),
        "items": [client.V1EnvVar(name="A", value="1"), {"name": "B"}],
    }

    assert to_json_shape(patch) == {
        "metadata": {"labels": {"app": "web"}},
        "items": [{"name": "A", "value": "1"}, {"name": "B"}],
    }


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(b"raw bytes", "bytes"), ({1, 2}, "set"), (object(), "object"), (1 + 2j, "complex")],
)
def test_an_unsupported_type_raises_type_error_naming_the_type(value: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=f"cannot send a {type_name} to the API server"):
        to_json_shape(value)


def test_an_unsupported_type_deep_inside_a_model_is_named() -> None:
    class Opaque:
        pass

    data: dict[str, Any] = {"key": Opaque()}  # the model does not check its values; the conversion must
    config_map = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"), data=data)

    with pytest.raises(TypeError, match="Opaque"):
        to_json_shape(config_map)


# -- json_copy ------------------------------------------------------------------------


def original() -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a/b"]},
        "spec": {"containers": [{"name": "web", "ports": [{"containerPort": 80}]}], "replicas": 2},
    }


def test_json_copy_is_equal_to_the_original() -> None:
    assert json_copy(original()) == original()


def test_mutating_a_json_copy_leaves_the_original_unchanged() -> None:
    source = original()

    copy = json_copy(source)
    copy["metadata"]["labels"]["app"] = "changed"
    copy["metadata"]["finalizers"].append("c/d")
    copy["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
    copy["spec"]["containers"].append({"name": "sidecar"})
    copy["spec"]["replicas"] = 5
    del copy["metadata"]["name"]

    assert source == original()


def test_json_copy_shares_no_container_with_the_original() -> None:
    source = original()

    copy = json_copy(source)

    assert copy["metadata"] is not source["metadata"]
    assert copy["metadata"]["finalizers"] is not source["metadata"]["finalizers"]
    assert copy["spec"]["containers"][0]["ports"][0] is not source["spec"]["containers"][0]["ports"][0]


def test_json_copy_of_a_top_level_list_and_of_scalars() -> None:
    items: list[Any] = [{"a": [1]}, [2, {"b": 3}], "s", None]

    copy = json_copy(items)
    copy[0]["a"].append(9)
    copy[1][1]["b"] = 4

    assert items == [{"a": [1]}, [2, {"b": 3}], "s", None]
    assert json_copy("text") == "text"
    assert json_copy(None) is None


# -- object_key and metadata ----------------------------------------------------------


def test_object_key_of_a_namespaced_object_is_namespace_slash_name() -> None:
    assert object_key({"metadata": {"namespace": "team-a", "name": "settings"}}) == "team-a/settings"


def test_object_key_of_a_cluster_scoped_object_is_its_name() -> None:
    assert object_key({"kind": "Namespace", "metadata": {"name": "team-a"}}) == "team-a"


def test_object_key_treats_an_empty_namespace_as_cluster_scoped() -> None:
    assert object_key({"metadata": {"namespace": "", "name": "node-1"}}) == "node-1"


@pytest.mark.parametrize("obj", [{}, {"metadata": None}, {"metadata": {}}])
def test_object_key_without_a_name_is_empty(obj: dict[str, Any]) -> None:
    assert object_key(obj) == ""


def test_metadata_gives_the_metadata_or_an_empty_mapping() -> None:
    assert metadata({"metadata": {"name": "x"}}) == {"name": "x"}
    assert metadata({}) == {}
    assert metadata({"metadata": "not a mapping"}) == {}
