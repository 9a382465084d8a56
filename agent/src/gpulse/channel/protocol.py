"""The wire format of the training channel (``docs/channel.md``): typed messages, as both ends see them.

The training client (``gpulse.training.client``) builds :class:`Point`, :class:`StepRows`,
:class:`Register` and :class:`Unregister` and encodes them here; ``gpulse status`` sends a :class:`StatusRequest`. The
agent's receiver answers with :class:`Ack` and :class:`StatusReply`, which the clients decode here
(:func:`decode_reply`). The agent decodes what it receives here too (:func:`decode_json`, and
:func:`decode_rows` beside :func:`encode_rows`, so that the two directions of the rows format are read
together) and checks it once, in :mod:`gpulse.channel.validate`, which turns it back into these
types. Standard library only, so that importing the training library stays cheap.

A datagram is UTF-8 JSON: one message object, or ``{"v": 1, "batch": [msg, ...]}``; or a rows
datagram (step points: a JSON header, then packed numbers, :func:`encode_rows`). Every message
carries ``"v"`` and ``"kind"``; ``point``, ``register`` and ``unregister`` also carry the sender's
``seq`` (increasing per client), and each row of a rows datagram has its own (the header's and the
ones after it), which the agent acknowledges with ``{"kind": "ack", "upto": seq}`` once everything
up to ``seq`` is durable.
"""

from __future__ import annotations

import json
import os
import struct
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from itertools import accumulate, starmap
from typing import Any

PROTOCOL_VERSION = 1
#: Largest datagram either side sends (the client packs batches under it; the agent rejects more).
MAX_DATAGRAM = 60 * 1024
#: Fields of one point the agent accepts at most (more: the message is refused, ``bad_fields`` or ``bad_rows``).
MAX_FIELDS = 256

KIND_POINT = "point"
KIND_REGISTER = "register"
KIND_UNREGISTER = "unregister"
KIND_STATUS = "status"
KIND_STATUS_REPLY = "status_reply"
KIND_ACK = "ack"
#: A rolling finding of the client's run raised, cleared or ended (the agent's ``train_finding`` point's
#: fields), so the run can list it in ``metrics_report.json`` (``live_findings``).
KIND_FINDING = "finding"
#: A rows datagram (step points, :class:`StepRows`): ``ROWS_PREFIX``, a JSON header with this kind,
#: a newline, then the rows packed as the header's ``kinds`` say (``docs/channel.md``).
KIND_ROWS = "rows"
#: First byte of a rows datagram (a JSON text never starts with it).
ROWS_PREFIX = b"R"
#: Kinds the agent acknowledges (they carry ``seq``).
SEQUENCED_KINDS = (KIND_POINT, KIND_REGISTER, KIND_UNREGISTER)
#: Kinds only the agent sends; a client sending one is rejected.
REPLY_KINDS = (KIND_ACK, KIND_STATUS_REPLY, KIND_FINDING)

#: Distinct open-field names (``log_*``, ``phase_*``) one run may send: a run logging thousands of
#: distinct scalars is making a mistake. The client drops the values of further new names, and so
#: does the agent (``too_many_open_fields``), whose memory this bounds.
MAX_OPEN_FIELDS_PER_RUN = 1024

#: File, in a run's output directory, where a client records the points no agent acknowledged
#: (line protocol and packed step rows, :mod:`gpulse.channel.recording`; ``gpulse upload`` sends it later).
RECORD_FILE = "gpulse-records.rec"

#: Environment variable that points the client at the agent's socket.
SOCKET_ENV = "GPULSE_SOCKET"
#: Prefix of the Linux abstract address a client binds so that the agent can reply.
CLIENT_ADDRESS_PREFIX = "\0gpulse-"

_SEPARATORS = (",", ":")


# -- addresses --------------------------------------------------------------------------------------
def default_socket_path(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR/gpulse/agent.sock``, else ``/tmp/gpulse-<uid>/agent.sock``.

    Per-user by construction, and checked before use (:mod:`gpulse.channel.trust`): under ``/tmp``
    another user may have created the directory first.
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


# -- messages ---------------------------------------------------------------------------------------
class _Message:
    """Slotted message types (not dataclasses: importing ``dataclasses`` would slow ``import gpulse.training``)."""

    __slots__ = ()

    def _attributes(self) -> list[str]:
        return [k for cls in type(self).__mro__ for k in getattr(cls, "__slots__", ())]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, k) == getattr(other, k) for k in self._attributes())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._attributes())})"

    __hash__ = None  # type: ignore[assignment]


class Point(_Message):
    """One ``train_step`` / ``train_run`` / ``train_event`` point with schema-named fields.

    ``tags`` never include ``host`` (the agent adds its own). ``seq`` is assigned by the client
    that sends it."""

    __slots__ = ("fields", "measurement", "seq", "tags", "ts")

    def __init__(
        self, measurement: str, ts: int, tags: Mapping[str, str], fields: dict[str, Any], seq: int | None = None
    ) -> None:
        self.measurement = measurement
        self.ts = ts
        self.tags = tags
        self.fields = fields
        self.seq = seq

    def wire(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "kind": KIND_POINT,
            "seq": self.seq,
            "m": self.measurement,
            "ts": self.ts,
            "tags": self.tags,
            "fields": self.fields,
        }


class PointHead:
    """What the points of one series share (measurement and tags), written as JSON once.

    ``rows`` is the start of a rows datagram's header for this series with the ``seq`` left open
    (``rows % seq``); a :class:`FieldShape` adds the rest."""

    __slots__ = ("measurement", "rows", "tags")

    def __init__(self, measurement: str, tags: Mapping[str, str]) -> None:
        self.measurement = measurement
        self.tags = tags
        self.rows = (
            ROWS_PREFIX
            + (
                f'{{"v":{PROTOCOL_VERSION},"kind":"{KIND_ROWS}","seq":%d,"m":{_literal(_dumps(measurement))},'
                f'"tags":{_literal(_dumps(tags))},'
            ).encode()
        )  # bytes: formatting bytes is faster than str and needs no encoding after


#: How a :class:`FieldShape` carries a value: an ``int``, a ``float``, or an ``int`` number of
#: nanoseconds that stands for a float of seconds (``ns / 1e9``, the double nearest to the true
#: quotient: what JSON and line-protocol readers, InfluxDB's included, make of ``<ns>e-9``).
KIND_INT, KIND_FLOAT, KIND_NS = "i", "f", "n"
#: How each kind is packed in a row (``struct``): int64 or float64.
_ROW_CODE = {KIND_INT: "q", KIND_FLOAT: "d", KIND_NS: "q"}


def row_struct(kinds: str) -> struct.Struct:
    """The layout of one row of fields carried as ``kinds``: little-endian, one int64 or float64 per
    field, then the timestamp (int64 Unix ns). Both ends derive it from ``kinds``: the agent never
    takes a layout from a client."""
    return struct.Struct("<" + "".join(map(_ROW_CODE.__getitem__, kinds)) + "q")


class FieldShape:
    """The field names of a kind of point, in order, and how each value is carried (``kinds``, one
    :data:`KIND_INT` / :data:`KIND_FLOAT` / :data:`KIND_NS` per name); ``row`` packs one row of them
    (:func:`row_struct`), ``header`` ends a rows datagram's header."""

    __slots__ = ("header", "kinds", "names", "pos", "row")

    def __init__(self, names: tuple[str, ...], kinds: str) -> None:
        if len(kinds) != len(names) or set(kinds) - set(_ROW_CODE):
            raise ValueError(f"kinds {kinds!r} do not describe the fields {names}")
        self.names = names
        self.kinds = kinds
        #: a name -> its index (one lookup to read one field of a row)
        self.pos = {n: i for i, n in enumerate(names)}
        self.row = row_struct(kinds)
        self.header = (_literal(_dumps({"names": list(names), "kinds": kinds})[1:]) + "\n").encode()

    def fields(self, row: tuple[int | float, ...]) -> dict[str, int | float]:
        """A row's fields as a point has them (durations as seconds); its last value, the timestamp, left out."""
        return {n: v / 1e9 if k == KIND_NS else v for n, k, v in zip(self.names, self.kinds, row)}  # noqa: B905


class StepRows:
    """Points of one series (``head``) and one :class:`FieldShape`, as rows: a tuple per point with one
    finite ``int`` or ``float`` per field (of the kind the shape says; durations in integer ns) and
    the timestamp last. What the training library makes of its steps, a slice at a time.

    On the wire they are one rows datagram (:func:`encode_rows`), without a name per value and
    without formatting a number; the report reads their fields only at ``finish()``, and the
    recording file keeps them packed too (:mod:`gpulse.channel.recording`)."""

    __slots__ = ("head", "rows", "shape")

    def __init__(self, head: PointHead, shape: FieldShape, rows: list[tuple[int | float, ...]]) -> None:
        self.head = head
        self.shape = shape
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, part: slice) -> StepRows:
        return StepRows(self.head, self.shape, self.rows[part])

    def points(self, seqs: Iterable[int | None] | None = None) -> list[Point]:
        """The rows as :class:`Point` objects (numbered ``seqs``): what the agent makes of them."""
        head, shape = self.head, self.shape
        seqs = [None] * len(self.rows) if seqs is None else seqs
        return [Point(head.measurement, r[-1], head.tags, shape.fields(r), q) for r, q in zip(self.rows, seqs, strict=True)]  # fmt: skip


def encode_rows(rows: StepRows, seq: int) -> bytes:
    """``rows`` as one rows datagram, the first numbered ``seq`` and the others after it; the caller
    keeps it under :data:`MAX_DATAGRAM` (:func:`rows_per_datagram`)."""
    return rows.head.rows % seq + rows.shape.header + b"".join(starmap(rows.shape.row.pack, rows.rows))


def rows_size(rows: StepRows) -> int:
    """The length of ``encode_rows(rows, seq)`` for any ``seq``, at most (a seq of 20 digits)."""
    return len(rows.head.rows) + _INT_CHARS + len(rows.shape.header) + rows.shape.row.size * len(rows.rows)


def rows_per_datagram(head: PointHead, shape: FieldShape, limit: int = MAX_DATAGRAM) -> int:
    """How many rows of ``shape`` one datagram carries: 0 when its header leaves no room for one, or
    when a row has more fields than the agent takes in one point (:data:`MAX_FIELDS`)."""
    if len(shape.names) > MAX_FIELDS:
        return 0
    return max((limit - len(head.rows) - _INT_CHARS - len(shape.header)) // shape.row.size, 0)


# -- the agent's reading of a datagram (what it then checks is :mod:`gpulse.channel.validate`'s) ------
class Rejected(Exception):
    """A message that cannot be accepted; ``cause`` is a key of :data:`gpulse.channel.validate.REJECT_CAUSES`.

    ``seq`` is the message's own, when it had a valid one: the agent acknowledges rejected messages
    too, since sending them again would not make them valid."""

    def __init__(self, cause: str, detail: str = "", seq: int | None = None) -> None:
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause
        self.detail = detail
        self.seq = seq


def _reject_constant(name: str) -> Any:
    raise Rejected("nonfinite", name)


def decode_json(data: bytes) -> Any:
    """A datagram's JSON (UTF-8; NaN and infinities refused); raises :class:`Rejected`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejected("not_utf8", str(exc)) from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except Rejected:
        raise
    except (ValueError, RecursionError) as exc:
        raise Rejected("bad_json", str(exc)[:200]) from None


def decode_rows(data: bytes) -> list[dict[str, Any]]:
    """A rows datagram (:func:`encode_rows`) read back by the agent, as the ``point`` messages its rows stand for: row
    ``i`` numbered ``seq + i``, each value named by the header's ``names``, a duration (kind ``n``)
    in seconds, the timestamp the row's last value. Names, kinds and layout are read by the client's
    own :class:`FieldShape` (the layout from ``kinds``, never from the
    sender); ``m``, ``tags`` and the values are checked like any point's (:mod:`gpulse.channel.validate`);
    raises :class:`Rejected`."""
    from gpulse.lineprotocol.limits import INT64_MAX  # only the agent decodes: the training process never loads it

    end = data.find(b"\n")
    if end < 0:
        raise Rejected("bad_rows", "no header")
    header = decode_json(data[1:end])
    if not isinstance(header, dict):
        raise Rejected("not_object", type(header).__name__)
    if not is_version(header.get("v")):
        raise Rejected("bad_version", repr(header.get("v"))[:40])
    if header.get("kind") != KIND_ROWS:
        raise Rejected("bad_kind", repr(header.get("kind"))[:40])
    seq, names, kinds = header.get("seq"), header.get("names"), header.get("kinds")
    if not (type(seq) is int and 0 <= seq <= INT64_MAX):
        raise Rejected("bad_seq", repr(seq)[:40])
    if not (
        isinstance(names, list)
        and 0 < len(names) <= MAX_FIELDS
        and all(type(n) is str for n in names)
        and len(set(names)) == len(names)
        and type(kinds) is str
    ):
        raise Rejected("bad_rows", "names and kinds", seq)
    try:
        shape = FieldShape(tuple(names), kinds)  # the client's own reading of names and kinds
    except ValueError:
        raise Rejected("bad_rows", "names and kinds", seq) from None
    layout = shape.row
    body = memoryview(data)[end + 1 :]
    if not body or len(body) % layout.size:
        raise Rejected("bad_rows", f"{len(body)} bytes of rows of {layout.size}", seq)
    if seq + len(body) // layout.size - 1 > INT64_MAX:
        raise Rejected("bad_seq", "the rows' numbers pass int64", seq)
    m, tags = header.get("m"), header.get("tags")
    return [
        {
            "v": PROTOCOL_VERSION,
            "kind": KIND_POINT,
            "seq": seq + i,
            "m": m,
            "ts": row[-1],
            "tags": tags,
            "fields": shape.fields(row),
        }
        for i, row in enumerate(layout.iter_unpack(body))
    ]


def is_version(v: Any) -> bool:
    """Whether ``v`` is this protocol's version (an ``int``: ``1.0`` and ``True`` are not)."""
    return type(v) is int and v == PROTOCOL_VERSION


#: Longest text of an int64.
_INT_CHARS = 20


class Register(_Message):
    """While registered, the agent tags these GPUs' samples with ``run``."""

    __slots__ = ("pid", "rank", "run", "seq", "uuids")

    def __init__(self, run: str, rank: str, pid: int, uuids: tuple[str, ...], seq: int | None = None) -> None:
        self.run = run
        self.rank = rank
        self.pid = pid
        self.uuids = uuids
        self.seq = seq

    def wire(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "kind": KIND_REGISTER,
            "seq": self.seq,
            "run": self.run,
            "rank": self.rank,
            "pid": self.pid,
            "uuids": list(self.uuids),
        }


class Unregister(_Message):
    """The run no longer uses its GPUs (the agent also notices when ``pid`` is gone)."""

    __slots__ = ("pid", "rank", "run", "seq")

    def __init__(self, run: str, rank: str, pid: int, seq: int | None = None) -> None:
        self.run = run
        self.rank = rank
        self.pid = pid
        self.seq = seq

    def wire(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "kind": KIND_UNREGISTER, "seq": self.seq, "run": self.run, "rank": self.rank, "pid": self.pid}  # fmt: skip


class StatusRequest(_Message):
    """Asks the agent for its snapshot (``gpulse status``); answered with a :class:`StatusReply`."""

    __slots__ = ("seq",)

    def __init__(self, seq: int | None = None) -> None:
        self.seq = seq

    def wire(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "kind": KIND_STATUS}


class Ack(_Message):
    """Everything from this client up to ``upto`` is durable (delivered, or fsynced by the agent).

    ``host`` is the agent's host tag, so that a client recording to its fallback file tags points
    exactly as the agent would (same series, no duplicates on upload)."""

    __slots__ = ("host", "upto")

    def __init__(self, upto: int, host: str | None = None) -> None:
        self.upto = upto
        self.host = host

    def wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": KIND_ACK, "upto": self.upto}
        if self.host:
            msg["host"] = self.host
        return msg


class StatusReply(_Message):
    """The agent's snapshot: GPUs, runs, lines/s, spool, last write (``gpulse status`` prints it)."""

    __slots__ = ("status",)

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def wire(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "kind": KIND_STATUS_REPLY, "status": self.status}


class FindingNote(_Message):
    """A finding of the client's run raised, cleared or ended (``gpulse.report.live.LiveFinding.as_dict``)."""

    __slots__ = ("finding",)

    def __init__(self, finding: dict[str, Any]) -> None:
        self.finding = finding

    def wire(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "kind": KIND_FINDING, "finding": self.finding}


Message = Point | Register | Unregister | StatusRequest | Ack | StatusReply


# -- encoding ---------------------------------------------------------------------------------------
def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=_SEPARATORS, ensure_ascii=False, allow_nan=False)


def _literal(text: str) -> str:
    """``text`` as it must appear in a ``%`` format to come out unchanged."""
    return text.replace("%", "%%")


def encode(message: Message) -> bytes:
    """One message as a datagram. Raises ``ValueError`` for NaN/Inf (the agent would reject them)."""
    return _dumps(message.wire()).encode()


def encode_batch(encoded: Iterable[bytes]) -> bytes:
    """Messages already passed through :func:`encode`, as one ``batch`` datagram."""
    return b'{"v":%d,"batch":[' % PROTOCOL_VERSION + b",".join(encoded) + b"]}"


#: Bytes a batch adds around its messages (the envelope plus one comma per message).
BATCH_OVERHEAD = len(encode_batch([]))


def datagram(encoded: Iterable[bytes], limit: int = MAX_DATAGRAM) -> tuple[int, bytes]:
    """The next datagram to send: as many of these encoded messages, in order, as fit in ``limit``
    bytes, and how many it took (at least one: a lone message over the limit is the sender's to handle)."""
    if isinstance(encoded, list):  # sizes added up in C, the cut found by bisection: no Python step per message
        ends = list(accumulate(map(_PLUS_COMMA, map(len, encoded))))
        group = encoded[: max(bisect_right(ends, limit - BATCH_OVERHEAD), 1)]
    else:
        group = []
        total = BATCH_OVERHEAD
        for data in encoded:
            if group and total + len(data) + 1 > limit:
                break
            group.append(data)
            total += len(data) + 1
    if len(group) <= 1:
        return len(group), group[0] if group else b""
    return len(group), encode_batch(group)


_PLUS_COMMA = (1).__add__  # a message's bytes in a batch: itself and its comma


#: Longest ``host`` an ack may carry (the schema's tag value limit).
MAX_HOST_LEN = 256


def decode_reply(data: bytes) -> Ack | StatusReply | FindingNote | None:
    """An agent's reply (one message per datagram), or ``None`` when it is not one a client accepts."""
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or msg.get("v") != PROTOCOL_VERSION or type(msg.get("v")) is not int:
        return None
    kind = msg.get("kind")
    if kind == KIND_ACK:
        upto, host = msg.get("upto"), msg.get("host")
        if type(upto) is not int or upto < 0:
            return None
        ok_host = type(host) is str and 0 < len(host) <= MAX_HOST_LEN
        return Ack(upto, host if ok_host else None)
    if kind == KIND_STATUS_REPLY and isinstance(msg.get("status"), dict):
        return StatusReply(msg["status"])
    if kind == KIND_FINDING and isinstance(msg.get("finding"), dict):
        return FindingNote(msg["finding"])
    return None
