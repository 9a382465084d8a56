"""The agent's reading of the channel: one check of everything that arrives, into typed messages.

Datagrams come from processes the agent does not control, so nothing is trusted. :func:`unpack`
opens the envelope (size, batch; the JSON and the rows are decoded by their own format's module,
:func:`~gpulse.channel.protocol.decode_json` and :func:`~gpulse.channel.protocol.decode_rows`, beside
the encoders); :meth:`Validator.message` checks each message once,
all of it (version, kind, seq, then its content against :mod:`gpulse.schema`), and returns a typed
message: a :class:`CheckedPoint` ready to encode, or the :mod:`~gpulse.channel.protocol` type the
client sent. A message that cannot be made valid is *rejected* with a cause
(:class:`~gpulse.channel.protocol.Rejected`, one of :data:`REJECT_CAUSES`); a
single bad field value (NaN in a logged loss, a string too long) is *dropped* with a cause and the
rest of the point kept, so one bad scalar never costs a training step.

Memory is bounded whatever arrives (``docs/channel.md``, "Limits"): checked tag sets and the
open-field names (``log_*``, ``phase_*``) of each run are remembered for at most :data:`MAX_RUNS`
runs, :data:`MAX_TAG_SETS_PER_RUN` tag sets and :data:`MAX_OPEN_FIELDS_PER_RUN` names each; a run
that logs more distinct names than that is making a mistake, and the names beyond are dropped and
counted (``too_many_open_fields``).

Also here: :func:`check_line_point`, the same schema rules for lines of a recording file
(``gpulse upload``).
"""

from __future__ import annotations

import math
import re
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulse import schema
from gpulse.channel.protocol import (
    KIND_POINT,
    KIND_REGISTER,
    KIND_STATUS,
    KIND_UNREGISTER,
    MAX_DATAGRAM,
    MAX_FIELDS,
    MAX_OPEN_FIELDS_PER_RUN,
    REPLY_KINDS,
    ROWS_PREFIX,
    SEQUENCED_KINDS,
    Register,
    Rejected,
    StatusRequest,
    Unregister,
    decode_json,
    decode_rows,
    is_version,
)
from gpulse.lineprotocol.encode import Series
from gpulse.lineprotocol.limits import INT64_MAX, INT64_MIN
from gpulse.lineprotocol.parse import ParsedLine as LinePoint

#: Measurements a training process may send over the channel.
CHANNEL_MEASUREMENTS = ("train_step", "train_run", "train_event")
#: Tags every training point carries (the agent adds ``host``).
REQUIRED_TAGS = ("run", "rank", "local_rank", "world_size")
_INT_TAGS = ("rank", "local_rank", "world_size")
_TAG_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_DIGITS = re.compile(r"\d{1,9}")
MAX_UUIDS = 64
MAX_UUID_LEN = 128
#: Accepted point timestamps: at most this far in the past / future of the agent's clock.
PAST_WINDOW_NS = 30 * 86400 * 10**9
FUTURE_WINDOW_NS = 300 * 10**9
#: Runs whose tag sets and open-field names are remembered (least recently used forgotten first).
MAX_RUNS = 32
#: Tags only the agent gives a training point, from the kernel: a rank naming one is refused (``reserved_tag``),
#: else a run could send its points to another team's database by naming that team's Slurm account.
AGENT_TAGS = frozenset(schema.JOB_TAGS) - {"job"}
#: Checked tag sets remembered per run (one per rank on this node, usually).
MAX_TAG_SETS_PER_RUN = 64

#: Why a whole message is rejected (one counter and one log line each): the datagram's envelope
#: first, then the message. ``docs/channel.md`` lists them from here (a test keeps them equal).
REJECT_CAUSES = {
    "too_large": f"datagram larger than {MAX_DATAGRAM} bytes",
    "not_utf8": "datagram is not UTF-8",
    "bad_json": "datagram is not JSON",
    "nonfinite": "NaN or Infinity in the JSON (not JSON, and never a valid value)",
    "bad_batch": '"batch" is not a list',
    "bad_rows": "a rows datagram whose header (seq, names, kinds) or length does not fit",
    "not_object": "message is not a JSON object",
    "bad_version": 'missing or unsupported "v"',
    "bad_kind": '"kind" is not one the channel knows',
    "unexpected_kind": "a kind only the agent sends (ack, status_reply)",
    "bad_seq": '"seq" missing (point, register, unregister) or not a non-negative integer',
    "bad_measurement": '"m" is not train_step, train_run or train_event',
    "bad_ts": '"ts" is not an integer (Unix ns)',
    "ts_out_of_window": '"ts" is more than 30 days in the past or 5 minutes in the future',
    "bad_tags": '"tags" is not an object',
    "missing_tag": "a required tag (run, rank, local_rank, world_size) is missing",
    "bad_tag_key": "a tag name is not an identifier",
    "bad_tag_value": "a tag value is not a non-empty string, too long, or rank/world_size not a number",
    "reserved_tag": "a tag name is reserved (host, time, a field name, or a job tag the agent reads from the kernel)",
    "too_many_tags": "more user tags than the schema allows",
    "bad_fields": f'"fields" is not an object, or has more than {MAX_FIELDS} entries',
    "no_valid_fields": "no field value survived validation",
    "bad_register": "register/unregister without a valid run, rank, pid or uuids",
    "too_many_registrations": "more live registrations than the agent keeps (see Limits)",
}
#: Why a single field value is dropped (the rest of the point is kept).
DROP_CAUSES = {
    "unknown_field": "field not declared in the schema nor matching its open-field pattern",
    "type_mismatch": "value type incompatible with the declared field type",
    "nonfinite": "NaN or infinite number",
    "string_too_long": f"string longer than schema.MAX_STRING_LEN ({schema.MAX_STRING_LEN})",
    "too_many_open_fields": f"a new log_*/phase_* name beyond the run's {MAX_OPEN_FIELDS_PER_RUN} distinct ones",
}


@dataclass(frozen=True, slots=True)
class CheckedPoint:
    """A point that passed every check: its series (tags with the agent's ``host``) and clean fields."""

    series: Series
    fields: dict[str, Any]
    ts: int
    seq: int | None
    run: str


Incoming = CheckedPoint | Register | Unregister | StatusRequest


# -- the envelope -----------------------------------------------------------------------------------
def unpack(data: bytes) -> list[Any]:
    """The messages of one datagram, unchecked (:meth:`Validator.message` checks each); raises :class:`Rejected`.

    A rows datagram becomes one ``point`` message per row (:func:`~gpulse.channel.protocol.decode_rows`)."""
    if len(data) > MAX_DATAGRAM:
        raise Rejected("too_large", f"{len(data)} bytes > {MAX_DATAGRAM}")
    if data[:1] == ROWS_PREFIX:
        return decode_rows(data)
    obj = decode_json(data)
    if isinstance(obj, dict) and "batch" in obj:
        if not is_version(obj.get("v")):
            raise Rejected("bad_version", repr(obj.get("v"))[:40])
        batch = obj["batch"]
        if not isinstance(batch, list):
            raise Rejected("bad_batch", type(batch).__name__)
        return batch
    return [obj]


# -- what the agent remembers per run ---------------------------------------------------------------
@dataclass(slots=True)
class _RunState:
    #: (measurement, tag items) -> the checked tag set's series
    tag_sets: OrderedDict[tuple[str, tuple[tuple[Any, Any], ...]], Series] = field(default_factory=OrderedDict)
    open_names: set[str] = field(default_factory=set)
    #: measurement -> one field-spec dict shared by the series of this run (open fields escaped once)
    specs: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    over_budget: bool = False


@dataclass
class Validator:
    """Checks channel messages for the agent on ``host``; counts dropped field values by cause in ``dropped``.

    ``over_budget`` collects the runs that just exceeded :data:`MAX_OPEN_FIELDS_PER_RUN` (once per
    run while it is remembered) for the receiver to name in its log."""

    host: str
    past_window_ns: int = PAST_WINDOW_NS
    future_window_ns: int = FUTURE_WINDOW_NS
    dropped: Counter[str] = field(default_factory=Counter)
    over_budget: list[str] = field(default_factory=list)
    _runs: OrderedDict[str, _RunState] = field(default_factory=OrderedDict, repr=False)
    #: (run, rank) -> the job holding the GPUs that rank registered (:meth:`set_rank_jobs`)
    _rank_jobs: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)
    #: (run, rank) -> the job tags the kernel gives the rank's process (:meth:`set_rank_attribution`)
    _rank_kernel: OrderedDict[tuple[str, str], dict[str, str]] = field(default_factory=OrderedDict, repr=False)
    #: measurement name -> declared field name -> type
    _declared: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)

    def message(self, msg: Any, now_ns: int) -> Incoming:
        """``msg`` (one element of :func:`unpack`) checked and typed; raises :class:`Rejected`."""
        if not isinstance(msg, dict):
            raise Rejected("not_object", type(msg).__name__)
        if not is_version(msg.get("v")):
            raise Rejected("bad_version", repr(msg.get("v"))[:40])
        kind = msg.get("kind")
        seq = msg.get("seq")
        if seq is not None or kind in SEQUENCED_KINDS:
            if not (type(seq) is int and 0 <= seq <= INT64_MAX):
                raise Rejected("bad_seq", repr(seq)[:40])
        try:
            if kind == KIND_POINT:
                return self._point(msg, seq, now_ns)
            if kind == KIND_REGISTER or kind == KIND_UNREGISTER:
                return _registration(msg, kind, seq)
            if kind == KIND_STATUS:
                return StatusRequest(seq)
        except Rejected as exc:
            exc.seq = seq
            raise
        if kind in REPLY_KINDS:
            raise Rejected("unexpected_kind", repr(kind), seq)
        raise Rejected("bad_kind", repr(kind)[:40], seq)

    def set_rank_jobs(self, jobs: dict[tuple[str, str], str]) -> None:
        """Tag the points of each (run, rank) in ``jobs`` that name no ``job`` themselves with that job.

        A process in its own cgroup namespace (a Kubernetes pod) cannot learn its job; the agent can,
        from the GPUs the rank registered. A change forgets the checked tag sets, so the next point of
        each series is checked again and gets its new job (changes are rare: a job starts or ends)."""
        if jobs == self._rank_jobs:
            return
        self._rank_jobs = dict(jobs)
        for state in self._runs.values():
            state.tag_sets.clear()

    def set_rank_attribution(self, run: str, rank: str, tags: dict[str, str]) -> bool:
        """Tag the points of (run, rank) with ``tags``, the job of its process as the kernel names it.

        They win over the job the rank names itself (``SLURM_JOB_ID`` can be set by anyone: once the kernel
        has named the process, the rank's own ``job`` is dropped, so a process in no job cannot pass for a
        routed job's; the job holding the GPUs it registered still applies), and they are the only source of
        ``account``, by which a ``[tenants]`` route sends points to a team's database. Whether anything
        changed (then the run's checked tag sets are forgotten, so its next points get the tags)."""
        key = (run, rank)
        if self._rank_kernel.get(key) == tags:
            return False
        self._rank_kernel[key] = dict(tags)
        while len(self._rank_kernel) > MAX_RUNS * MAX_TAG_SETS_PER_RUN:
            self._rank_kernel.popitem(last=False)
        state = self._runs.get(run)
        if state is not None:
            state.tag_sets.clear()
        return True

    def rank_attribution(self, run: str, rank: str) -> dict[str, str]:
        """The job tags :meth:`set_rank_attribution` gave (run, rank), ``{}`` when none."""
        return self._rank_kernel.get((run, rank), {})

    # -- points -----------------------------------------------------------------------------------
    def _point(self, msg: Mapping[str, Any], seq: int | None, now_ns: int) -> CheckedPoint:
        name = msg.get("m")
        if name not in CHANNEL_MEASUREMENTS:
            raise Rejected("bad_measurement", repr(name)[:40])
        m = schema.MEASUREMENTS[name]
        ts = msg.get("ts")
        if type(ts) is not int:
            raise Rejected("bad_ts")
        if not now_ns - self.past_window_ns <= ts <= now_ns + self.future_window_ns:
            raise Rejected("ts_out_of_window", f"{(ts - now_ns) / 1e9:+.0f} s from now")
        run, state, series = self._series(m, msg.get("tags"))
        fields = msg.get("fields")
        if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
            raise Rejected("bad_fields")
        clean = self._fields(m, fields, run, state)
        if not clean:
            raise Rejected("no_valid_fields")
        return CheckedPoint(series, clean, ts, seq, run)

    def reseries(self, msg: Mapping[str, Any], point: CheckedPoint) -> CheckedPoint:
        """``point`` (checked from ``msg``) with its series made again, after its rank's job tags changed.

        Only the tags are checked again: its fields were counted once, when ``point`` was checked."""
        m = schema.MEASUREMENTS[point.series.measurement]
        return CheckedPoint(self._series(m, msg["tags"])[2], point.fields, point.ts, point.seq, point.run)

    def _series(self, m: schema.Measurement, tags: Any) -> tuple[str, _RunState, Series]:
        """The run, its state and the series of a tag set: checked once, then remembered (bounded)."""
        try:
            run = tags["run"]
            state = self._runs[run]
            key = (m.name, tuple(tags.items()))
            series = state.tag_sets[key]
        except (KeyError, TypeError):  # unseen, or not a dict / unhashable: check_tags says why
            return self._new_series(m, tags)
        self._runs.move_to_end(run)
        state.tag_sets.move_to_end(key)
        return run, state, series

    def _new_series(self, m: schema.Measurement, tags: Any) -> tuple[str, _RunState, Series]:
        checked = check_tags(m, tags)
        run = checked["run"]
        state = self._runs.get(run)
        if state is None:
            if len(self._runs) >= MAX_RUNS:
                self._runs.popitem(last=False)
            state = self._runs[run] = _RunState()
        else:
            self._runs.move_to_end(run)
        specs = state.specs.setdefault(m.name, {})
        holder = self._rank_jobs.get((run, checked["rank"]))
        kernel = self._rank_kernel.get((run, checked["rank"]))
        if kernel is not None:  # the kernel named the rank's process: the job it is in, else the GPUs' holder
            checked.pop("job", None)  # never the job the rank names itself
            for key, value in kernel.items():
                if key in schema.TRAINING_JOB_TAGS and key in m.optional_tags:
                    checked[key] = value
        if holder is not None and "job" not in checked and "job" in m.optional_tags:
            checked["job"] = holder
        series = Series(m, m.name, {**checked, "host": self.host}, specs)
        if all(type(v) is str for v in tags.values()):  # 1 == 1.0 == True: only exact strings are keys
            if len(state.tag_sets) >= MAX_TAG_SETS_PER_RUN:
                state.tag_sets.popitem(last=False)
            state.tag_sets[(m.name, tuple(tags.items()))] = series
        return run, state, series

    def _fields(self, m: schema.Measurement, fields: Mapping[str, Any], run: str, state: _RunState) -> dict[str, Any]:
        """The field values that fit ``m``, coerced to their declared types; the rest counted in ``dropped``.

        Hot path (every training step of every rank): a finite ``float`` for a float field and an
        in-range ``int`` for an int field are accepted after one lookup; anything else goes
        through :func:`coerce`."""
        types = self._declared.get(m.name)
        if types is None:
            types = self._declared[m.name] = {f.name: f.type for f in m.fields}
        out: dict[str, Any] = {}
        for name, value in fields.items():
            t = types.get(name)
            if t is None:
                t = self._open_field(m, name, run, state)
                if t is None:
                    continue
            if t == "float":
                if type(value) is float and value - value == 0.0:
                    out[name] = value
                    continue
            elif t == "int" and type(value) is int and INT64_MIN <= value <= INT64_MAX:
                out[name] = value
                continue
            cause, v = coerce(t, value)
            if cause:
                self.dropped[cause] += 1
            else:
                out[name] = v
        return out

    def _open_field(self, m: schema.Measurement, name: str, run: str, state: _RunState) -> str | None:
        """``float`` for an open field (``log_*``, ``phase_*``) within the run's budget; else counted, ``None``."""
        if m.open_fields is not None and name in state.open_names:
            return "float"
        if m.open_fields is None or m.field_type(name) is None:
            self.dropped["unknown_field"] += 1
            return None
        if len(state.open_names) >= MAX_OPEN_FIELDS_PER_RUN:
            self.dropped["too_many_open_fields"] += 1
            if not state.over_budget:
                state.over_budget = True
                self.over_budget.append(run)
            return None
        state.open_names.add(name)
        return "float"


def _registration(msg: Mapping[str, Any], kind: str, seq: int | None) -> Register | Unregister:
    run, rank, pid = msg.get("run"), msg.get("rank"), msg.get("pid")
    if type(rank) is int:
        rank = str(rank)
    if not (
        isinstance(run, str)
        and 0 < len(run) <= schema.MAX_TAG_VALUE_LEN
        and isinstance(rank, str)
        and _DIGITS.fullmatch(rank)
        and type(pid) is int
        and 0 < pid < 2**31
    ):
        raise Rejected("bad_register")
    if kind == KIND_UNREGISTER:
        return Unregister(run, rank, pid, seq)
    uuids = msg.get("uuids") or []
    if not (
        isinstance(uuids, list)
        and len(uuids) <= MAX_UUIDS
        and all(isinstance(u, str) and 0 < len(u) <= MAX_UUID_LEN and u.isprintable() for u in uuids)
    ):
        raise Rejected("bad_register", "uuids")
    return Register(run, rank, pid, tuple(uuids), seq)


def check_tags(m: schema.Measurement, tags: Any) -> dict[str, str]:
    """The tag set of a training point, checked; raise :class:`Rejected` with the first problem."""
    if not isinstance(tags, dict):
        raise Rejected("bad_tags")
    out: dict[str, str] = {}
    extra = 0
    for key, value in tags.items():
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
            raise Rejected("bad_tag_key", repr(key)[:40])
        if key in ("host", "time") or key in m.by_name or key in AGENT_TAGS:
            raise Rejected("reserved_tag", key)
        if type(value) is int:
            value = str(value)
        if not isinstance(value, str) or not value or len(value) > schema.MAX_TAG_VALUE_LEN:
            raise Rejected("bad_tag_value", key)
        if key in _INT_TAGS and not _DIGITS.fullmatch(value):
            raise Rejected("bad_tag_value", key)
        if key not in REQUIRED_TAGS and key not in m.optional_tags:  # the schema's tags are not the user's
            extra += 1
        out[key] = value
    for key in REQUIRED_TAGS:
        if key not in out:
            raise Rejected("missing_tag", key)
    if extra > m.max_extra_tags:
        raise Rejected("too_many_tags", f"{extra} > {m.max_extra_tags}")
    return out


def coerce(t: str, value: Any) -> tuple[str | None, Any]:
    """``(None, value as field type t)`` when it fits, else ``(drop cause, None)``."""
    if t == "float":
        if type(value) is float:
            return (None, value) if math.isfinite(value) else ("nonfinite", None)
        if type(value) is int:
            return (None, float(value)) if abs(value) < 2**1023 else ("nonfinite", None)
        return "type_mismatch", None
    if t == "int":
        if type(value) is int:
            return (None, value) if INT64_MIN <= value <= INT64_MAX else ("type_mismatch", None)
        if type(value) is float:
            if not math.isfinite(value):
                return "nonfinite", None
            if value.is_integer() and INT64_MIN <= value <= INT64_MAX:
                return None, int(value)
        return "type_mismatch", None
    if t == "str":
        if not isinstance(value, str):
            return "type_mismatch", None
        return (None, value) if len(value) <= schema.MAX_STRING_LEN else ("string_too_long", None)
    return (None, value) if type(value) is bool else ("type_mismatch", None)


def check_line_point(p: LinePoint) -> str | None:
    """Why a parsed recording line must not be uploaded, or ``None`` when it is fine.

    Line types must equal the schema's (InfluxDB refuses a field whose type differs from the one
    stored), and a timestamp is required: without one the server would stamp the upload time, so
    uploading the same file twice would duplicate the point.
    """
    m = schema.MEASUREMENTS.get(p.measurement)
    if m is None:
        return f"unknown measurement {p.measurement!r}"
    if p.ts is None:
        return "no timestamp (an upload must be idempotent)"
    if "host" not in p.tags:
        return "no host tag"
    if p.measurement in CHANNEL_MEASUREMENTS:
        for key in ("run", "rank"):
            if key not in p.tags:
                return f"no {key} tag"
    for key, value in p.tags.items():
        if len(value) > schema.MAX_TAG_VALUE_LEN:
            return f"tag {key!r} longer than {schema.MAX_TAG_VALUE_LEN}"
    for name, value in p.fields.items():
        t = m.field_type(name)
        if t is None:
            return f"field {name!r} is not in the schema of {p.measurement}"
        actual = {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]
        if actual != t:
            return f"field {name!r} is {actual}, the schema says {t}"
        if t == "str" and len(value) > schema.MAX_STRING_LEN:
            return f"field {name!r} longer than {schema.MAX_STRING_LEN}"
    return None
