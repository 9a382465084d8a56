"""The DaemonSet in deploy/kubernetes is a valid object of the Kubernetes API and has what a GPU node agent needs.

Validated offline against the official OpenAPI schemas that ``kubernetes-validate`` ships (strict:
an unknown or misspelt key fails), for 1.28 (the pod-resources API is GA from there) and the newest
version it has; then the properties the agent relies on are read from the parsed YAML.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.fixtures import REPO

from gpulse.sources.attribution.podresources import DEFAULT_SOCKET

MANIFEST = REPO / "deploy" / "kubernetes" / "daemonset.yaml"


@pytest.fixture(scope="module")
def daemonset() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert len(docs) == 1 and docs[0]["kind"] == "DaemonSet"
    return docs[0]


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def agent(ds: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(ds)["containers"]
    return container


@pytest.mark.parametrize("version", ["1.28.0", kubernetes_validate.latest_version()])
def test_the_manifest_validates_against_the_official_schema(daemonset, version):
    assert kubernetes_validate.validate(daemonset, version, strict=True)


def test_a_misspelt_key_fails_validation(daemonset):
    """The check above can fail: strict validation refuses a key the API does not have."""
    broken = copy.deepcopy(daemonset)
    agent(broken)["livenessProbe"]["exec"]["cmd"] = agent(broken)["livenessProbe"]["exec"].pop("command")
    with pytest.raises(kubernetes_validate.ValidationError, match="'cmd' was unexpected"):
        kubernetes_validate.validate(broken, "1.28.0", strict=True)


def test_the_pod_runs_on_gpu_nodes_with_the_nvidia_runtime_and_sees_host_pids(daemonset):
    spec = pod_spec(daemonset)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["hostPID"] is True  # attribution reads /proc/PID of processes in other pods
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["automountServiceAccountToken"] is False


def test_the_kubelets_pod_resources_directory_is_mounted_read_only_not_its_socket(daemonset):
    socket_dir = DEFAULT_SOCKET.rsplit("/", 1)[0]
    (volume,) = [v for v in pod_spec(daemonset)["volumes"] if v.get("hostPath", {}).get("path") == socket_dir]
    assert volume["hostPath"]["type"] == "Directory"
    (mount,) = [m for m in agent(daemonset)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": socket_dir, "readOnly": True}


def test_requests_and_limits_are_set(daemonset):
    resources = agent(daemonset)["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}


def test_liveness_is_gpulse_status_asking_the_agents_socket(daemonset):
    c = agent(daemonset)
    assert c["livenessProbe"]["exec"]["command"][:2] == ["gpulse", "status"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GPULSE_SOCKET"]["value"] in {m["mountPath"] + "/agent.sock" for m in c["volumeMounts"]}


def test_the_token_comes_from_a_secret_file_and_is_nowhere_in_the_manifest(daemonset):
    c = agent(daemonset)
    env = {e["name"]: e for e in c["env"]}
    assert "GPULSE_TOKEN" not in env
    token_file = env["GPULSE_TOKEN_FILE"]["value"]
    (mount,) = [m for m in c["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod_spec(daemonset)["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume and mount["readOnly"] is True
    assert not any("token" in a.lower() for a in c.get("args", []) + c.get("command", []))


def test_the_host_tag_is_the_nodes_name(daemonset):
    env = {e["name"]: e for e in agent(daemonset)["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPULSE_HOST"]["value"] == "$(NODE_NAME)"
    names = [e["name"] for e in agent(daemonset)["env"]]
    assert names.index("NODE_NAME") < names.index("GPULSE_HOST")  # $(VAR) expands only earlier variables


def test_every_gpulse_variable_is_one_the_agent_reads(daemonset):
    from gpulse.agent.config import _SETTINGS, CONNECTION_KEYS, env_name

    known = {env_name(s) for s in (*_SETTINGS, *CONNECTION_KEYS)} | {"GPULSE_CONFIG", "GPULSE_SOCKET"}
    used = {e["name"] for e in agent(daemonset)["env"] if e["name"].startswith("GPULSE_")}
    assert used <= known, used - known
