"""The wire format of the training channel (see ``docs/channel.md`` and ``docs/training.md``).

Both sides import this module: the training client (``gpulse.training.client``) builds and
sends messages with it, the agent's receiver (``gpulse.sources.training``) decodes them. It is
stdlib-only so that importing the training library stays cheap.

A datagram is UTF-8 JSON: one message object, or ``{"v": 1, "batch": [msg, ...]}``. Every message
carries ``"v"`` and ``"kind"``; ``point``, ``register`` and ``unregister`` also carry the sender's
``seq`` (increasing per client), which the agent acknowledges with ``{"kind": "ack", "upto": seq}``
once everything up to ``seq`` is durable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

PROTOCOL_VERSION = 1
#: Largest datagram either side sends (the client packs batches under it; the agent rejects more).
MAX_DATAGRAM = 60 * 1024

KIND_POINT = "point"
KIND_REGISTER = "register"
KIND_UNREGISTER = "unregister"
KIND_STATUS = "status"
KIND_STATUS_REPLY = "status_reply"
KIND_ACK = "ack"
KINDS = (KIND_POINT, KIND_REGISTER, KIND_UNREGISTER, KIND_STATUS, KIND_STATUS_REPLY, KIND_ACK)
#: Kinds the agent acknowledges (they carry ``seq``).
SEQUENCED_KINDS = (KIND_POINT, KIND_REGISTER, KIND_UNREGISTER)
#: Measurements a ``point`` may carry.
POINT_MEASUREMENTS = ("train_step", "train_run", "train_event")

#: Environment variable that points the client at the agent's socket.
SOCKET_ENV = "GPULSE_SOCKET"
#: Prefix of the Linux abstract address a client binds so that the agent can reply.
CLIENT_ADDRESS_PREFIX = "\0gpulse-"

_SEPARATORS = (",", ":")


class ProtocolError(ValueError):
    """A datagram that is not a valid message; ``cause`` is a short stable name for counting."""

    def __init__(self, cause: str, detail: str = "") -> None:
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause


# -- addresses --------------------------------------------------------------------------------------
def default_socket_path(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR/gpulse/agent.sock``, else ``/tmp/gpulse-<uid>/agent.sock``.

    Per-user by construction: runs of different users never share a default socket.
    """
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "gpulse", "agent.sock")
    return os.path.join("/tmp", f"gpulse-{os.getuid()}", "agent.sock")


def client_socket_path(env: Mapping[str, str] | None = None) -> str:
    """The agent socket a client talks to: ``$GPULSE_SOCKET``, else :func:`default_socket_path`."""
    env = os.environ if env is None else env
    return env.get(SOCKET_ENV) or default_socket_path(env)


def client_address(pid: int | None = None) -> str:
    """A fresh Linux abstract address (``"\\0gpulse-<pid>-<random>"``) for a client socket."""
    return f"{CLIENT_ADDRESS_PREFIX}{os.getpid() if pid is None else pid}-{os.urandom(6).hex()}"


# -- message builders -------------------------------------------------------------------------------
def point(seq: int, measurement: str, ts_ns: int, tags: Mapping[str, str], fields: Mapping[str, Any]) -> dict:
    """A ``point``: one ``train_step`` / ``train_run`` / ``train_event`` with schema-named fields."""
    return {
        "v": PROTOCOL_VERSION,
        "kind": KIND_POINT,
        "seq": seq,
        "m": measurement,
        "ts": ts_ns,
        "tags": dict(tags),
        "fields": dict(fields),
    }


def register(seq: int, run: str, rank: str, pid: int, uuids: Iterable[str]) -> dict:
    """``register``: while registered, the agent tags these GPUs' samples with ``run``."""
    return {
        "v": PROTOCOL_VERSION,
        "kind": KIND_REGISTER,
        "seq": seq,
        "run": run,
        "rank": str(rank),
        "pid": pid,
        "uuids": list(uuids),
    }


def unregister(seq: int, run: str, rank: str, pid: int) -> dict:
    """``unregister``: the run no longer uses its GPUs (same shape as ``register``, no uuids)."""
    return {"v": PROTOCOL_VERSION, "kind": KIND_UNREGISTER, "seq": seq, "run": run, "rank": str(rank), "pid": pid}


def status_request() -> dict:
    return {"v": PROTOCOL_VERSION, "kind": KIND_STATUS}


def status_reply(status: Mapping[str, Any]) -> dict:
    return {"v": PROTOCOL_VERSION, "kind": KIND_STATUS_REPLY, "status": dict(status)}


def ack(upto: int, host: str | None = None) -> dict:
    """Everything up to ``seq`` ``upto`` is durable. ``host`` is the agent's host tag, so that a client
    recording to its fallback file tags points exactly as the agent would (same series, no duplicates)."""
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": KIND_ACK, "upto": upto}
    if host:
        msg["host"] = host
    return msg


# -- encoding ---------------------------------------------------------------------------------------
def encode(message: Mapping[str, Any]) -> bytes:
    """One message as a datagram. Raises ``ValueError`` for NaN/Inf (the agent would reject them)."""
    return json.dumps(message, separators=_SEPARATORS, ensure_ascii=False, allow_nan=False).encode()


def encode_batch(encoded: Iterable[bytes]) -> bytes:
    """Messages already passed through :func:`encode`, as one ``batch`` datagram."""
    return b'{"v":%d,"batch":[' % PROTOCOL_VERSION + b",".join(encoded) + b"]}"


#: Bytes a batch adds around its messages (the envelope plus one comma per message).
BATCH_OVERHEAD = len(encode_batch([]))


def pack(encoded: Iterable[bytes], limit: int = MAX_DATAGRAM) -> list[bytes]:
    """Group encoded messages, in order, into as few datagrams of at most ``limit`` bytes as possible.

    A lone message larger than ``limit`` is returned on its own (the sender decides what to do).
    """
    out: list[bytes] = []
    group: list[bytes] = []
    size = BATCH_OVERHEAD
    for msg in encoded:
        if group and size + len(msg) + 1 > limit:
            out.append(group[0] if len(group) == 1 else encode_batch(group))
            group, size = [], BATCH_OVERHEAD
        group.append(msg)
        size += len(msg) + 1
    if group:
        out.append(group[0] if len(group) == 1 else encode_batch(group))
    return out


def _reject_constant(name: str) -> Any:
    raise ProtocolError("nonfinite", name)


def decode(data: bytes) -> list[dict]:
    """The messages of one datagram, unwrapped from a batch; raises :class:`ProtocolError`.

    Checks only the envelope (size, UTF-8, JSON without NaN/Inf, version, kind); the receiver
    validates each message's content against ``gpulse.schema``.
    """
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError("too_large", f"{len(data)} bytes > {MAX_DATAGRAM}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("not_utf8", str(exc)) from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad_json", str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise ProtocolError("not_object", type(obj).__name__)
    if "batch" in obj:
        _check_version(obj)
        batch = obj["batch"]
        if not isinstance(batch, list):
            raise ProtocolError("bad_batch", "batch is not a list")
        for msg in batch:
            _check_message(msg)
        return batch
    _check_message(obj)
    return [obj]


def _check_version(obj: dict) -> None:
    v = obj.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", repr(v)[:40])


def _check_message(msg: Any) -> None:
    if not isinstance(msg, dict):
        raise ProtocolError("not_object", type(msg).__name__)
    _check_version(msg)
    kind = msg.get("kind")
    if kind not in KINDS:
        raise ProtocolError("bad_kind", repr(kind)[:40])
    if kind in SEQUENCED_KINDS:
        seq = msg.get("seq")
        if type(seq) is not int or seq < 0:
            raise ProtocolError("bad_seq", repr(seq)[:40])
