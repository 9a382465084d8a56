"""Which pod holds each GPU, from the kubelet's pod-resources API (``v1.PodResourcesLister/List``).

The kubelet serves it on ``/var/lib/kubelet/pod-resources/kubelet.sock`` (GA in 1.28): for every
pod its name, namespace and containers, each container with the devices the device plugins gave
it (resource ``nvidia.com/gpu``, device ids = GPU UUIDs; MIG ids ``MIG-<uuid>``). It names the
holder of a GPU even when no process of the pod is on it yet; it does not give the pod's UID.

The messages are described here as the subset of the kubelet's ``pkg/apis/podresources/v1/api.proto``
that gpulse reads (same names, numbers and types; protobuf skips the fields left out), and built
by ``google.protobuf`` at run time: no generated code is shipped. ``grpcio`` and ``protobuf`` are
optional agent-side imports (``pip install gpulse[kubernetes]``); without them, or without the
socket, :class:`PodResources` answers nothing and says why once in the log, and attribution comes
from cgroups alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
#: Resource names of MIG devices exposed by NVIDIA's device plugin (mixed strategy).
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
LIST_METHOD = "/v1.PodResourcesLister/List"

#: (message, [(field name, number, label, type, message type)]) in api.proto's own terms.
_STRING, _MESSAGE = "TYPE_STRING", "TYPE_MESSAGE"
_ONE, _MANY = "LABEL_OPTIONAL", "LABEL_REPEATED"
MESSAGES: tuple[tuple[str, tuple[tuple[str, int, str, str, str], ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, _MANY, _MESSAGE, "PodResources"),)),
    (
        "PodResources",
        (
            ("name", 1, _ONE, _STRING, ""),
            ("namespace", 2, _ONE, _STRING, ""),
            ("containers", 3, _MANY, _MESSAGE, "ContainerResources"),
        ),
    ),
    (
        "ContainerResources",
        (("name", 1, _ONE, _STRING, ""), ("devices", 2, _MANY, _MESSAGE, "ContainerDevices")),
    ),
    (
        "ContainerDevices",
        (("resource_name", 1, _ONE, _STRING, ""), ("device_ids", 2, _MANY, _STRING, "")),
    ),
)


@dataclass(frozen=True)
class PodHolder:
    """The pod (and container) a GPU is allocated to."""

    namespace: str
    pod: str
    container: str


def message_classes() -> dict[str, Any]:
    """The message classes of :data:`MESSAGES`, built from a file descriptor (raises ImportError without protobuf)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="gpulse/podresources_v1_subset.proto", package="v1", syntax="proto3")
    for name, fields in MESSAGES:
        msg = fd.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            msg.field.add(
                name=fname,
                number=number,
                label=descriptor_pb2.FieldDescriptorProto.Label.Value(label),
                type=descriptor_pb2.FieldDescriptorProto.Type.Value(ftype),
                type_name=f".v1.{type_name}" if type_name else None,
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}")) for name, _ in MESSAGES}


def gpu_holders(response: Any) -> dict[str, PodHolder]:
    """GPU id (UUID, or MIG device UUID) -> its one holder, from a ``ListPodResourcesResponse``.

    A GPU shared by time-slicing appears as ``<uuid>::<n>`` in several pods: it has no one holder
    and is left out, as is any GPU listed for two containers."""
    found: dict[str, set[PodHolder]] = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.resource_name == GPU_RESOURCE or d.resource_name.startswith(MIG_RESOURCE_PREFIX):
                    for dev in d.device_ids:
                        found.setdefault(dev.split("::")[0], set()).add(PodHolder(pod.namespace, pod.name, c.name))
    return {dev: next(iter(h)) for dev, h in found.items() if len(h) == 1}


class PodResources:
    """The kubelet's answer to ``List``, asked at most every ``refresh_s``; empty when it cannot be asked.

    A failed call is logged once per kind of failure and retried after ``retry_s``, so a kubelet that
    restarts costs one short timeout a minute, not one per cycle.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout_s: float = 1.0,
        refresh_s: float = 5.0,
        retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.clock = clock
        self._call: Any = None
        self._request: Any = None
        self._holders: dict[str, PodHolder] = {}
        self._next = 0.0
        self._said: set[str] = set()
        #: why the last attempt got no answer (None after an answer)
        self.unavailable: str | None = None

    def holders(self) -> dict[str, PodHolder]:
        """GPU id -> holder, as of the last answer within ``refresh_s``."""
        now = self.clock()
        if now < self._next:
            return self._holders
        try:
            self._holders = gpu_holders(self._list())
            self.unavailable = None
            self._next = now + self.refresh_s
        except Exception as e:
            self._holders = {}
            self._next = now + self.retry_s
            self._fallback(e)
        return self._holders

    def _list(self) -> Any:
        if not os.path.exists(self.socket_path):
            raise FileNotFoundError(f"no kubelet pod-resources socket at {self.socket_path}")
        if self._call is None:
            import grpc  # optional: only where the kubelet's socket is mounted

            classes = message_classes()
            channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=classes["ListPodResourcesRequest"].SerializeToString,
                response_deserializer=classes["ListPodResourcesResponse"].FromString,
            )
            self._request = classes["ListPodResourcesRequest"]()
        return self._call(self._request, timeout=self.timeout_s)

    def _fallback(self, e: Exception) -> None:
        if isinstance(e, ImportError):
            why = f"{e.name or e} is not installed (pip install 'gpulse[kubernetes]')"
        elif isinstance(e, FileNotFoundError):
            why = str(e)
        else:
            self._call = None  # reconnect next time (the kubelet may have restarted)
            why = f"the kubelet's pod-resources API failed: {type(e).__name__}: {str(e)[:200]}"
        self.unavailable = why
        kind = why.split(":")[0]
        if kind not in self._said:
            self._said.add(kind)
            log.info("%s; attributing GPU processes from their cgroups only", why)
