"""The kubelet names the pod holding each GPU, also one with no process on it; without it, cgroups alone.

The kubelet is the stand-in of ``support/kubelet_podresources.py``: the kubelet's own ``api.proto``
compiled with ``grpcio-tools`` and served on a Unix socket, so the agent's client speaks the
kubelet's wire format. The agent runs for real on the NVML stand-in, with one process in a real
cgroup of a pod (``support/cgroups.py``) where the machine allows it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cgroups
from support.fake_pynvml import h100
from support.kubelet_podresources import Kubelet, Pod, compile_proto
from support.nvml_agent import newest_tags, record_agent

from gpulse.sources.attribution import podresources
from gpulse.sources.attribution.podresources import PodHolder, PodResources
from gpulse.sources.processes import ProcessDescriber

POD_UID = "9d4b6f3e-5c7a-4b2d-8e4f-3a5b7c9d1e3f"
CID = "beef" * 16
GPU = [h100(i).uuid for i in range(4)]


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    pods = [
        Pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [GPU[0]])], "sidecar": [("example.com/nic", ["eth9"])]}),
        Pod("ml", "eval-0", {"main": [("nvidia.com/gpu", [GPU[1]])]}),  # allocated, process not started yet
        Pod("ci", "a", {"c": [("nvidia.com/gpu", [f"{GPU[2]}::0"])]}),  # time-sliced: shared by two pods
        Pod("ci", "b", {"c": [("nvidia.com/gpu", [f"{GPU[2]}::1"])]}),
    ]
    k = Kubelet(tmp_path / "kubelet", tmp_path / "kubelet.sock", pods, [("nvidia.com/gpu", GPU)])
    yield k
    k.stop()


def test_the_message_subset_gpulse_reads_is_the_kubelets_proto(tmp_path):
    """Names, numbers, labels and types of every field gpulse reads agree with the compiled api.proto."""
    pb, _ = compile_proto(tmp_path)
    ours = podresources.message_classes()
    for name, fields in podresources.MESSAGES:
        real = {f.name: f for f in getattr(pb, name).DESCRIPTOR.fields}
        mine = {f.name: f for f in ours[name].DESCRIPTOR.fields}
        assert set(mine) == {f[0] for f in fields} and set(mine) <= set(real), name
        for fname, f in mine.items():
            r = real[fname]
            assert (f.number, f.type, f.is_repeated) == (r.number, r.type, r.is_repeated), f"{name}.{fname}"
            if f.message_type is not None:
                assert f.message_type.name == r.message_type.name
    assert pb.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name["List"].full_name == (
        podresources.LIST_METHOD.strip("/").replace("/", ".")
    )


def test_each_gpus_holder_comes_from_list_and_a_shared_gpu_has_none(kubelet):
    holders = PodResources(str(kubelet.socket_path)).holders()
    assert holders == {GPU[0]: PodHolder("ml", "trainer-0", "main"), GPU[1]: PodHolder("ml", "eval-0", "main")}
    assert kubelet.calls == {"List": 1}


def test_the_stand_in_answers_get_allocatable_resources_and_refuses_get_like_a_kubelet_without_the_gate(kubelet):
    """The stand-in's other methods, through the stub compiled from the kubelet's proto."""
    import grpc

    pb, stubs = compile_proto(kubelet.socket_path.parent / "client")
    with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
        stub = stubs.PodResourcesListerStub(channel)
        answer = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=5)
        assert [(d.resource_name, list(d.device_ids)) for d in answer.devices] == [("nvidia.com/gpu", GPU)]
        with pytest.raises(grpc.RpcError) as refused:
            stub.Get(pb.GetPodResourcesRequest(pod_name="trainer-0", pod_namespace="ml"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_kubelet_is_asked_once_per_refresh_and_a_new_allocation_shows_after_it(kubelet):
    now = [0.0]
    pods = PodResources(str(kubelet.socket_path), refresh_s=5.0, clock=lambda: now[0])
    pods.holders()
    kubelet.pods.append(Pod("ml", "late", {"main": [("nvidia.com/gpu", [GPU[3]])]}))
    assert GPU[3] not in pods.holders() and kubelet.calls["List"] == 1
    now[0] = 5.0
    assert pods.holders()[GPU[3]] == PodHolder("ml", "late", "main") and kubelet.calls["List"] == 2


def test_the_agent_records_pod_and_namespace_of_each_gpus_holder_with_or_without_a_process(
    kubelet, tmp_path, monkeypatch
):
    reason = cgroups.unavailable()
    if reason is not None:
        pytest.skip(reason)
    tree = cgroups.CgroupTree()
    try:
        slice_ = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice"
        proc = tree.start(cgroups.v2_root(), f"{slice_}/cri-containerd-{CID}.scope")  # type: ignore[arg-type]
        gpus = [h100(0, compute_procs=[(proc.pid, 1 << 30)]), h100(1), h100(2), h100(3)]
        describer = ProcessDescriber(pods=PodResources(str(kubelet.socket_path)))
        points = record_agent(tmp_path, monkeypatch, gpus, describer)
    finally:
        tree.close()
    process = [p for p in points if p.measurement == "gpu_process"][-1]
    assert {k: process.tags.get(k) for k in ("gpu", "job", "pod", "namespace")} == {
        "gpu": "0",
        "job": POD_UID,
        "pod": "trainer-0",
        "namespace": "ml",
    }
    assert process.fields["container"] == "main"  # the container's name, from the kubelet
    newest = newest_tags(points, "gpu")
    assert (newest["0"]["job"], newest["0"]["pod"]) == (POD_UID, "trainer-0")
    assert "job" not in newest["1"] and (newest["1"]["pod"], newest["1"]["namespace"]) == ("eval-0", "ml")
    assert "pod" not in newest["2"] and "pod" not in newest["3"]  # shared, and free


def test_without_the_socket_or_grpc_attribution_says_why_once_and_answers_nothing(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=podresources.__name__)
    now = [0.0]
    pods = PodResources(str(tmp_path / "absent.sock"), retry_s=60, clock=lambda: now[0])
    for t in (0.0, 60.0, 120.0):
        now[0] = t
        assert pods.holders() == {}
    assert pods.unavailable == f"no kubelet pod-resources socket at {tmp_path / 'absent.sock'}"
    (tmp_path / "absent.sock").touch()
    monkeypatch.setitem(sys.modules, "grpc", None)  # grpcio not installed
    now[0] = 180.0
    assert pods.holders() == {} and "pip install 'gpulse[kubernetes]'" in str(pods.unavailable)
    now[0] = 240.0
    pods.holders()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert all(m.endswith("attributing GPU processes from their cgroups only") for m in messages)
