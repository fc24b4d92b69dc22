"""The stand-in ``kind`` of the provider's tests: kind's answers, from a JSON state file a test edits.

No container runtime exists where these tests run, so each test writes this
tiny ``kind`` executable into its own directory and puts it first on ``PATH``.
It answers ``kind get clusters`` and ``kind get kubeconfig --name X
[--internal]`` with kind's output format, messages and exit codes. The
clusters behind it are real testbed control planes.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

_STANDIN = r'''#!{python} -IS
"""Stand-in for the kind CLI (tests only): answers from the JSON state file next to it."""
import json
import os
import subprocess
import sys
import time

RUNTIME_DOWN = (
    "failed to list clusters: command \"docker ps -a --filter label=io.x-k8s.kind.cluster "
    "--format '{{{{.Label \"io.x-k8s.kind.cluster\"}}}}'\" failed with error: exit status 1\n"
    "Command Output: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)


def fail(message):
    sys.stderr.write("ERROR: " + message + "\n")
    sys.exit(1)


def scalar(value):
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar; {{}} and [] are flow YAML


def block(value, indent):
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(indent + key + ":")
                lines.extend(block(item, indent + "  "))
            else:
                lines.append(indent + key + ": " + scalar(item))
    else:
        for item in value:
            if isinstance(item, dict) and item:
                inner = block(item, indent + "  ")
                inner[0] = indent + "- " + inner[0][len(indent) + 2:]
                lines.extend(inner)
            else:
                lines.append(indent + "- " + scalar(item))
    return lines


with open({state!r}) as file:
    state = json.load(file)
args = sys.argv[1:]
if state.get("hang"):  # a kind stuck on its runtime: say who we are, then never answer
    runtime = subprocess.Popen(["sleep", "60"])  # a runtime CLI that inherited kind's output pipes
    with open({pid!r}, "w") as file:
        file.write(str(os.getpid()) + " " + str(runtime.pid))
    time.sleep(60)
if args == ["get", "clusters"]:
    if not state["runtime_up"]:
        fail(RUNTIME_DOWN)
    names = sorted(state["clusters"])
    if not names:
        sys.stderr.write("No kind clusters found.\n")
    for name in names:
        print(name)
    sys.exit(0)
if args[:3] == ["get", "kubeconfig", "--name"] and len(args) >= 4 and args[4:] in ([], ["--internal"]):
    name = args[3]
    if not state["runtime_up"]:
        fail(RUNTIME_DOWN.replace("failed to list clusters", "failed to list nodes"))
    cluster = state["clusters"].get(name)
    if cluster is None:
        fail("could not locate any control plane nodes for cluster named '" + name + "'. "
             "Use the --name option to select a different cluster")
    if not cluster["readable"]:
        fail("failed to get cluster internal kubeconfig: command \"docker exec --privileged "
             + name + "-control-plane cat /etc/kubernetes/admin.conf\" failed with error: exit status 1")
    config = cluster["admin_conf"]
    key = "kind-" + name  # kind renames the one cluster, user and context of admin.conf
    config["clusters"][0]["name"] = key
    config["users"][0]["name"] = key
    config["contexts"][0]["name"] = key
    config["contexts"][0]["context"].update(cluster=key, user=key)
    config["current-context"] = key
    if args[4:] == ["--internal"]:
        config["clusters"][0]["cluster"]["server"] = "https://" + name + "-control-plane:6443"
    print("\n".join(block(config, "")))
    sys.exit(0)
fail("unknown command " + " ".join(args))
'''


class FakeKind:
    """The stand-in's state: what ``kind`` will answer next time it runs."""

    def __init__(self, directory: Path) -> None:
        self.bin = directory / "bin"
        self.bin.mkdir()
        self.state_path = directory / "kind-state.json"
        self.pid_path = directory / "hanging.pid"
        self.state: dict[str, Any] = {"runtime_up": True, "hang": False, "clusters": {}}
        self._save()
        self.executable = self.install(self.bin / "kind")

    def install(self, path: Path) -> Path:
        """Write the stand-in executable to ``path``."""
        path.write_text(
            _STANDIN.format(python=sys.executable, state=str(self.state_path), pid=str(self.pid_path))
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def _save(self) -> None:
        partial = self.state_path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.state))
        os.replace(partial, self.state_path)  # the stand-in never reads half a file

    def create(self, name: str, kubeconfig: dict[str, Any], *, readable: bool = True) -> None:
        """A cluster ``name`` whose control plane holds ``kubeconfig`` (its admin.conf)."""
        self.state["clusters"][name] = {"admin_conf": kubeconfig, "readable": readable}
        self._save()

    def delete(self, name: str) -> None:
        del self.state["clusters"][name]
        self._save()

    def readable(self, name: str, readable: bool) -> None:
        self.state["clusters"][name]["readable"] = readable
        self._save()

    def runtime(self, *, up: bool) -> None:
        self.state["runtime_up"] = up
        self._save()

    def hang(self) -> None:
        self.state["hang"] = True
        self._save()
