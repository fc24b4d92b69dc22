"""The kwok stages of the testbed: how a fake node and its Pods move through their lives.

kwok changes objects only as its stages say; it ships none of its own when run
alone. These are the testbed's, written for what controller tests need:

``node-ready``
    a node kwok manages turns Ready with room for many Pods;
``pod-running``
    a Pod bound to a node starts: Running, its containers started, an IP;
``pod-succeeded``
    after ``run_seconds`` a Running Pod that a Job owns exits 0 (Pods of
    Deployments and the like keep running);
``pod-failed``
    after ``run_seconds`` a Running Pod annotated ``testbed.mcruntime.dev/exit-code``
    exits with that code and fails: how a test makes a Job fail on purpose;
``pod-deleted``
    a Pod being deleted goes away, as a kubelet confirms a deletion.
"""

from __future__ import annotations

from typing import Any

NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok manages the nodes that carry this annotation with the value ``fake``."""

EXIT_CODE_ANNOTATION = "testbed.mcruntime.dev/exit-code"
"""On a Pod (its template, for a Job): the exit code its containers end with; non-zero fails the Pod."""

_NODE_STATUS = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "True"
  reason: KubeletReady
  message: kwok node of the mcruntime testbed
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
allocatable: {cpu: "64", memory: 256Gi, pods: "250"}
capacity: {cpu: "64", memory: 256Gi, pods: "250"}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: ""
  kubeProxyVersion: ""
  osImage: ""
  machineID: ""
  systemUUID: ""
  bootID: ""
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
conditions:
{{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs: [{ip: {{ . | Quote }}}]
{{ end }}
{{ $host := or .spec.hostNetwork false }}
{{ with PodIPWith .spec.nodeName $host .metadata.uid .metadata.name .metadata.namespace }}
podIP: {{ . | Quote }}
podIPs: [{ip: {{ . | Quote }}}]
{{ end }}
"""


def _pod_finished(phase: str, exit_code: str, reason: str) -> str:
    return f"""\
{{{{ $now := Now }}}}
{{{{ $root := . }}}}
phase: {phase}
conditions:
{{{{ range list "ContainersReady" "Ready" }}}}
- type: {{{{ . }}}}
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{{{ $now | Quote }}}}
{{{{ end }}}}
containerStatuses:
{{{{ range $index, $container := .spec.containers }}}}
- name: {{{{ $container.name | Quote }}}}
  image: {{{{ $container.image | Quote }}}}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: {exit_code}
      reason: {reason}
      startedAt: {{{{ $root.status.startTime | Quote }}}}
      finishedAt: {{{{ $now | Quote }}}}
{{{{ end }}}}
"""


def _stage(
    name: str,
    kind: str,
    expressions: list[dict[str, Any]],
    next_: dict[str, Any],
    delay: dict[str, int] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": expressions},
        "next": next_,
    }
    if delay is not None:
        spec["delay"] = delay
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _is(key: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


def stages(run_seconds: float) -> list[dict[str, Any]]:
    """The stage objects, for kwok's ``--config`` (one YAML document each)."""
    alive = _is(".metadata.deletionTimestamp", "DoesNotExist")
    exit_code = f'.metadata.annotations["{EXIT_CODE_ANNOTATION}"]'
    delay = {"durationMilliseconds": max(0, round(run_seconds * 1000))}
    return [
        _stage(
            "node-ready",
            "Node",
            [_is('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", "True")],
            {"statusTemplate": _NODE_STATUS},
        ),
        _stage(
            "pod-running",
            "Pod",
            [alive, _is(".spec.nodeName", "Exists"), _is(".status.phase", "In", "Pending")],
            {"statusTemplate": _POD_RUNNING},
        ),
        _stage(
            "pod-succeeded",
            "Pod",
            [
                alive,
                _is(".status.phase", "In", "Running"),
                _is(".metadata.ownerReferences.[].kind", "In", "Job"),
                _is(exit_code, "DoesNotExist"),
            ],
            {"statusTemplate": _pod_finished("Succeeded", "0", "Completed")},
            delay,
        ),
        _stage(
            "pod-failed",
            "Pod",
            [alive, _is(".status.phase", "In", "Running"), _is(exit_code, "Exists")],
            {
                "statusTemplate": _pod_finished(
                    "Failed", f'{{{{ index $root.metadata.annotations "{EXIT_CODE_ANNOTATION}" }}}}', "Error"
                )
            },
            delay,
        ),
        _stage("pod-deleted", "Pod", [_is(".metadata.deletionTimestamp", "Exists")], {"delete": True}),
    ]
