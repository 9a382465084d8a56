"""A stand-in for the kubelet's pod-resources gRPC service, built from the kubelet's own ``api.proto``.

What it stands in for: the ``v1.PodResourcesLister`` service a kubelet serves on
``/var/lib/kubelet/pod-resources/kubelet.sock`` (``pkg/apis/podresources/v1/api.proto`` and
``api_grpc.pb.go`` of ``kubernetes/kubelet``, copied in ``support/kubelet/``; the server side is
``pkg/kubelet/apis/podresources/server_v1.go`` of ``kubernetes/kubernetes``, not read for this).
The proto is compiled with ``grpcio-tools`` into the test's temporary directory, so the messages,
field numbers and method names on the wire are the kubelet's.

Where it differs: the pods and devices are what the test gives, not what a device manager
allocated; ``List`` and ``GetAllocatableResources`` answer from them, ``Get`` (alpha, behind the
``KubeletPodResourcesGet`` feature gate) answers ``UNIMPLEMENTED`` as with the gate off; CPU ids,
memory and dynamic resources are left empty; it serves no other service (the kubelet's socket
has none either).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import grpc

PROTO = Path(__file__).parent / "kubelet" / "api.proto"
#: The package the compiled modules live in (one name per test session's sys.modules).
PACKAGE = "kubelet_podresources_v1"


def compile_proto(tmp: Path) -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)`` compiled from the kubelet's proto into ``tmp``."""
    src, out = tmp / "proto", tmp / "generated"
    (src / PACKAGE).mkdir(parents=True)
    out.mkdir()
    shutil.copy(PROTO, src / PACKAGE / "api.proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"--python_out={out}", f"--grpc_python_out={out}",
         f"{PACKAGE}/api.proto"],
        check=True,
    )  # fmt: skip
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]  # another test's temporary directory is gone
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module(f"{PACKAGE}.api_pb2"), importlib.import_module(f"{PACKAGE}.api_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@dataclass
class Pod:
    namespace: str
    name: str
    #: container name -> (resource name, device ids)
    containers: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)


class Kubelet:
    """The service on a Unix socket; ``pods`` may be changed while it serves; ``calls`` counts requests."""

    def __init__(self, tmp: Path, socket_path: Path, pods: list[Pod], allocatable: list[tuple[str, list[str]]]):
        self.pb, grpc_mod = compile_proto(tmp)
        self.pods = pods
        self.allocatable = allocatable
        self.calls: dict[str, int] = {}
        self.socket_path = socket_path
        stand_in = self

        class Servicer(grpc_mod.PodResourcesListerServicer):
            def List(self, request, context):
                stand_in._count("List")
                return stand_in.pb.ListPodResourcesResponse(pod_resources=[stand_in._pod(p) for p in stand_in.pods])

            def GetAllocatableResources(self, request, context):
                stand_in._count("GetAllocatableResources")
                return stand_in.pb.AllocatableResourcesResponse(devices=stand_in._devices(stand_in.allocatable))

            def Get(self, request, context):
                stand_in._count("Get")
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "PodResources API Get method disabled")

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        grpc_mod.add_PodResourcesListerServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{socket_path}")
        self.server.start()

    def _count(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1

    def _devices(self, devices: list[tuple[str, list[str]]]) -> list:
        return [self.pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices]

    def _pod(self, p: Pod):
        containers = [self.pb.ContainerResources(name=n, devices=self._devices(d)) for n, d in p.containers.items()]
        return self.pb.PodResources(name=p.name, namespace=p.namespace, containers=containers)

    def stop(self) -> None:
        self.server.stop(grace=None).wait()
