"""The agent's end of the training channel: a thread reading datagrams from a Unix socket.

The server half of :mod:`gpulse.channel.endpoint` (the clients' socket). It lives in the channel
because it needs nothing of the agent's: ``submit`` and ``durable`` are plain callables (the
agent passes its ``Delivery``'s), so the channel stays a leaf (standard library, schema, line protocol).

Training processes (``gpulse.training``) send ``point`` / ``register`` / ``unregister`` / ``status``
messages (``gpulse.channel.protocol``). Each message is checked once (:mod:`gpulse.channel.validate`,
which hands back typed messages; a point comes with its series, tagged with ``host``), valid points
are encoded and handed to ``submit`` — the same delivery path as the GPU samples — and each client
gets ``ack`` messages once its points are durable, so it can forget them. Malformed input is counted
by cause, logged once per cause, and never stops the thread. What a client can make the agent
remember is bounded (``docs/channel.md``, "Limits").

Who may write: the socket lives in a directory the agent creates 0700 (0750 with a group) and is
itself 0600 (0660), and Linux checks write permission on the socket file for every sender, so
runs of other users cannot inject points.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import select
import socket
import stat
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulse.channel import protocol
from gpulse.channel.endpoint import CREDENTIALS_SPACE, sender_pid
from gpulse.channel.validate import MAX_OPEN_FIELDS_PER_RUN, CheckedPoint, Rejected, Validator, unpack
from gpulse.lineprotocol.encode import Encoder

log = logging.getLogger("gpulse.training_channel")

Submit = Callable[[list[str]], int]
#: ``observe(measurement, tags, fields, ts)``: sees every accepted ``train_step`` / ``train_run`` point
Observe = Callable[[str, dict[str, str], dict[str, Any], int], None]
#: the measurements an observer is shown
OBSERVED = ("train_step", "train_run")
#: ``attribute(pid)``: the job tags (``schema.JOB_TAGS``) the kernel gives a process, ``{}`` when in no job,
#: ``None`` when the process cannot be read
Attribute = Callable[[int], "dict[str, str] | None"]

#: Seconds between checks that registered training processes still exist.
LIVENESS_INTERVAL_S = 2.0
#: Minimum seconds between two acks to the same client (~10 acks/s at most).
ACK_INTERVAL_S = 0.1
#: Clients silent for this long lose their ack state (they are gone or will resend).
CLIENT_IDLE_S = 120.0
MAX_CLIENTS = 1024
#: (seq, ticket) pairs remembered per client; beyond it the newest pairs are merged (acks are cumulative).
MAX_PENDING = 4096
#: Live registrations (run, rank, pid) kept; more are rejected (``too_many_registrations``). Far more
#: ranks than one node runs; each may name up to ``validate.MAX_UUIDS`` GPUs (about 12 KiB at most).
MAX_REGISTRATIONS = 1024
#: Processes named by runs' start points kept for host sampling; a further one evicts the oldest
#: (counted in ``processes_evicted``, the agent's ``training_processes_evicted``).
MAX_STARTED = MAX_REGISTRATIONS


@dataclass
class _Client:
    pending: deque[tuple[int, int]] = field(default_factory=deque)
    last_ticket: int = 0
    last_seen: float = 0.0
    last_ack: float = 0.0
    acked: int = -1
    #: a submit of this client's points failed: acks are cumulative, so none may be sent any more
    #: (the client records its unacknowledged points to its file; duplicates are harmless)
    broken: bool = False
    #: the run whose points this client sends (its rolling findings are told to it)
    run: str | None = None


class TrainingReceiver:
    def __init__(
        self,
        path: str,
        host: str,
        submit: Submit,
        *,
        group: str | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
        durable: Callable[[], int] | None = None,
        observe: Observe | None = None,
        attribute: Attribute | None = None,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """``submit(lines) -> ticket`` is ``Delivery.submit``; ``durable()`` returns the highest durable
        ticket (default: ``submit.__self__.durable_upto`` when ``submit`` is a Delivery's bound method);
        ``observe`` is shown each accepted training step and run point (the agent's rolling findings);
        ``attribute`` names the job of a rank's process (its start point's or registration's pid), whose
        tags its points then carry from that point on.
        """
        self.path = path
        self.host = host
        self._submit = submit
        self.group = group
        self._status = status
        if durable is None:
            owner = getattr(submit, "__self__", None)
            if owner is not None and hasattr(owner, "durable_upto"):
                durable = lambda: owner.durable_upto  # noqa: E731
        self._durable = durable
        self._observe = observe
        self._attribute = attribute
        self._sender: int | None = None  # the process that sent the datagram being handled
        self._now_ns = now_ns
        self._validator = Validator(host)
        self._encoder = Encoder()
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._clients: dict[Any, _Client] = {}
        self._registrations: dict[tuple[str, str, int], protocol.Register] = {}
        #: (run, rank, pid) named by runs' start points and not ended yet, the oldest first
        self._started: dict[tuple[str, str, int], None] = {}
        #: start points' processes forgotten to make room for a newer one (:data:`MAX_STARTED`)
        self.processes_evicted = 0
        self._gpu_runs: dict[str, str] = {}
        #: GPU uuid -> the job holding it, as the agent's last sample saw it (:meth:`note_gpu_jobs`)
        self._gpu_jobs: dict[str, str] = {}
        self._jobs_version = 0
        self._jobs_applied = 0
        self.runs_version = 0
        self._max_ticket = 0
        self._logged: set[str] = set()
        self.records_received = 0
        self.records_accepted = 0
        self.rejected: Counter[str] = Counter()
        self.lines_submitted = 0
        self.acks_sent = 0
        self.status_replies = 0
        self.submit_errors = 0
        self._last_liveness = 0.0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> TrainingReceiver:
        """Create the directory and socket and start the reader thread; raise ``OSError`` if impossible."""
        self._sock = self._bind()
        self._thread = threading.Thread(target=self._loop, name="gpulse-training-channel", daemon=True)
        self._thread.start()
        log.info("training channel listening on %s", self.path)
        return self

    def close(self) -> None:
        """Stop the thread, close the socket and remove the socket file if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    def _bind(self) -> socket.socket:
        directory = os.path.dirname(os.path.abspath(self.path))
        gid = grp.getgrnam(self.group).gr_gid if self.group else None
        dir_mode, sock_mode = (0o750, 0o660) if gid is not None else (0o700, 0o600)
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=dir_mode, exist_ok=True)
            os.chmod(directory, dir_mode)
            if gid is not None:
                os.chown(directory, -1, gid)
        st = os.stat(directory)
        if st.st_uid != os.geteuid():
            raise PermissionError(
                f"socket directory {directory} belongs to uid {st.st_uid}, not to this user: "
                "choose another --socket path"
            )
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise PermissionError(f"socket directory {directory} is writable by everyone: choose another --socket path")
        self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177 if gid is None else 0o117)
        try:
            sock.bind(self.path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        os.chmod(self.path, sock_mode)
        if gid is not None:
            os.chown(self.path, -1, gid)
        st = os.lstat(self.path)
        self._inode = (st.st_dev, st.st_ino)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        except OSError:
            pass
        # the kernel attaches each sender's pid (SCM_CREDENTIALS): a rank's job is read from the process
        # that sends its points, never from the pid a message names
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        return sock

    def _remove_stale(self) -> None:
        """Remove a socket file left by a dead agent; refuse if an agent still listens or it is no socket."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise FileExistsError(f"{self.path} exists and is not a socket: refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(self.path)
        except OSError:
            os.unlink(self.path)  # nobody listens: a previous agent died without cleaning up
            return
        finally:
            probe.close()
        raise OSError(errno.EADDRINUSE, f"another gpulse agent is listening on {self.path}")

    # -- the reader thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([sock], [], [], ACK_INTERVAL_S)
                if ready:
                    # Drain what is queued, but return to acks and liveness at least every ACK_INTERVAL_S.
                    deadline = time.monotonic() + ACK_INTERVAL_S
                    while time.monotonic() < deadline:
                        try:
                            data, ancillary, _flags, addr = sock.recvmsg(
                                protocol.MAX_DATAGRAM + 1, CREDENTIALS_SPACE, socket.MSG_DONTWAIT
                            )
                        except (BlockingIOError, InterruptedError):
                            break
                        self.handle_datagram(data, addr, sender_pid(ancillary))
                self._send_acks()
                now = time.monotonic()
                if now - self._last_liveness >= LIVENESS_INTERVAL_S:
                    self._last_liveness = now
                    self._check_liveness()
                    self._expire_clients(now)
            except Exception as e:  # the channel must outlive any bug in one message's handling
                self._count_once("internal_error", repr(e))
                time.sleep(0.05)

    def handle_datagram(self, data: bytes, addr: Any = None, sender: int | None = None) -> None:
        """Check and act on one datagram; never raises. Public so tests can drive it directly.

        ``sender``: the sending process's id as the kernel gave it; a rank's job tags are read from it
        (without it, from the pid the message names: only tests call this without a socket)."""
        self._sender = sender
        try:
            messages = unpack(data)
        except Rejected as e:
            self.records_received += 1
            self._reject(e.cause, e.detail)
            return
        except Exception as e:
            self.records_received += 1
            self._reject("bad_json", repr(e))
            return
        if self._jobs_applied != self._jobs_version:
            self._apply_rank_jobs()
        now_ns = self._now_ns()
        lines: list[str] = []
        max_seq = -1
        run: str | None = None
        for raw in messages:
            try:
                msg = self._validator.message(raw, now_ns)
            except Rejected as e:
                self.records_received += 1
                self._reject(e.cause, e.detail)
                if e.seq is not None:
                    max_seq = max(max_seq, e.seq)  # acked too: resending it would not make it valid
                continue
            if type(msg) is protocol.StatusRequest:
                self._reply_status(addr)  # a question about the agent, not a training record: not counted
                continue
            self.records_received += 1
            if type(msg) is CheckedPoint:
                if self._note_start(raw, msg):  # its process's job is known now: this point carries it too
                    msg = self._validator.reseries(raw, msg)
                line = self._encoder.line(msg.series, msg.fields, msg.ts)
                if line is not None:
                    lines.append(line)
                self._show(raw, msg)
                run = msg.run
            elif not self._register(msg):
                if msg.seq is not None:
                    max_seq = max(max_seq, msg.seq)  # rejected, and acked like any rejected message
                continue
            self.records_accepted += 1
            if msg.seq is not None:
                max_seq = max(max_seq, msg.seq)
        self._note_dropped_values()
        client = self._client(addr) if addr else None
        if client is not None and run is not None:
            client.run = run
        ticket = client.last_ticket if client else self._max_ticket
        if lines:
            try:
                ticket = self._submit(lines)
            except Exception as e:
                self.submit_errors += 1
                self._count_once("submit_failed", repr(e))
                if client is not None:
                    client.broken = True
                    client.pending.clear()
                return
            self.lines_submitted += len(lines)
            self._max_ticket = max(self._max_ticket, ticket)
        if client is not None and max_seq >= 0 and not client.broken:
            client.last_ticket = ticket
            if len(client.pending) >= MAX_PENDING:
                seq0, ticket0 = client.pending.pop()
                client.pending.append((max(seq0, max_seq), max(ticket0, ticket)))
            else:
                client.pending.append((max_seq, ticket))

    def _client(self, addr: Any) -> _Client:
        c = self._clients.get(addr)
        if c is None:
            if len(self._clients) >= MAX_CLIENTS:
                oldest = min(self._clients, key=lambda a: self._clients[a].last_seen)
                del self._clients[oldest]
            c = self._clients[addr] = _Client(last_ticket=self._max_ticket)
        c.last_seen = time.monotonic()
        return c

    # -- acks -------------------------------------------------------------------------------------
    def durable_upto(self) -> int:
        if self._durable is None:
            return self._max_ticket  # no delivery to ask: handing over is as durable as it gets
        try:
            return int(self._durable())
        except Exception as e:
            self._count_once("durable_failed", repr(e))
            return 0

    def _send_acks(self) -> None:
        if not self._clients:
            return
        durable = self.durable_upto()
        now = time.monotonic()
        gone = []
        for addr, c in self._clients.items():
            if not c.pending or now - c.last_ack < ACK_INTERVAL_S:
                continue
            upto = -1
            while c.pending and c.pending[0][1] <= durable:
                upto = max(upto, c.pending.popleft()[0])
            if upto <= c.acked:
                continue
            c.last_ack = now
            if self._send(addr, protocol.Ack(upto, self.host)):
                c.acked = upto
                self.acks_sent += 1
            else:
                gone.append(addr)
        for addr in gone:
            self._clients.pop(addr, None)

    def tell(self, run: str, finding: dict[str, Any]) -> int:
        """Send a finding of ``run`` to each client that sends that run's points; how many were told.

        Called from the agent's loop: ``sendto`` on a datagram socket is safe beside the reader thread."""
        told = 0
        for addr, c in list(self._clients.items()):
            if c.run == run and self._send(addr, protocol.FindingNote(finding)):
                told += 1
        return told

    def _send(self, addr: Any, message: protocol.Ack | protocol.StatusReply | protocol.FindingNote) -> bool:
        """Send to a client without blocking; ``False`` when the client is gone (its address is unbound)."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto(protocol.encode(message), socket.MSG_DONTWAIT, addr)
            return True
        except (BlockingIOError, InterruptedError):
            return True  # its queue is full: the next ack carries a higher upto
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                self._count_once("send_failed", repr(e))
            return False

    def _expire_clients(self, now: float) -> None:
        for addr in [a for a, c in self._clients.items() if now - c.last_seen > CLIENT_IDLE_S and not c.pending]:
            del self._clients[addr]

    # -- status -----------------------------------------------------------------------------------
    def _reply_status(self, addr: Any) -> None:
        if not addr:
            return
        try:
            snapshot = self._status() if self._status else {}
            reply = protocol.StatusReply({**snapshot, "training_channel": self.stats()})
            if len(protocol.encode(reply)) > protocol.MAX_DATAGRAM:
                reply = protocol.StatusReply({"error": "status too large for one datagram"})
        except Exception as e:
            self._count_once("status_failed", repr(e))
            reply = protocol.StatusReply({"error": f"status unavailable: {type(e).__name__}"})
        if self._send(addr, reply):
            self.status_replies += 1

    # -- registrations ----------------------------------------------------------------------------
    def _register(self, msg: protocol.Register | protocol.Unregister) -> bool:
        """Apply a (un)registration; ``False`` (rejected, counted) when the agent keeps enough already."""
        key = (msg.run, msg.rank, msg.pid)
        if type(msg) is protocol.Unregister:
            self._registrations.pop(key, None)
        elif key in self._registrations or len(self._registrations) < MAX_REGISTRATIONS:
            self._registrations[key] = msg
            self._attribute_rank(msg.run, msg.rank, msg.pid)
        else:
            self._reject("too_many_registrations", f"{len(self._registrations)} live registrations")
            return False
        self._rebuild_gpu_runs()
        return True

    def _check_liveness(self) -> None:
        self._started = {k: None for k in self._started if pid_alive(k[2])}
        dead = [k for k, r in self._registrations.items() if not pid_alive(r.pid)]
        if dead:
            for k in dead:
                log.info("training run %s rank %s (pid %d) is gone: unregistered", *k)
                del self._registrations[k]
            self._rebuild_gpu_runs()

    def _rebuild_gpu_runs(self) -> None:
        mapping: dict[str, str] = {}
        for r in self._registrations.values():  # insertion order: the latest registration wins a shared GPU
            for uuid in r.uuids:
                mapping[uuid] = r.run
        if mapping != self._gpu_runs:
            self._gpu_runs = mapping
            self.runs_version += 1
        self._apply_rank_jobs()

    def note_gpu_jobs(self, jobs: dict[str, str]) -> None:
        """GPU uuid -> the job holding it (the ``job`` tag of its ``gpu`` point); called by the agent's loop.

        The reader thread picks a change up before its next datagram (the dict is replaced, never mutated)."""
        if jobs != self._gpu_jobs:
            self._gpu_jobs = dict(jobs)
            self._jobs_version += 1

    def _apply_rank_jobs(self) -> None:
        """Give the validator each registered rank's job: the one job holding all the GPUs it registered."""
        self._jobs_applied = self._jobs_version
        gpu_jobs = self._gpu_jobs
        uuids: dict[tuple[str, str], set[str]] = {}
        for r in self._registrations.values():
            uuids.setdefault((r.run, r.rank), set()).update(r.uuids)
        jobs: dict[tuple[str, str], str] = {}
        for key, held in uuids.items():
            found = {gpu_jobs.get(u) for u in held}
            job = found.pop() if len(found) == 1 else None
            if job is not None:
                jobs[key] = job
        self._validator.set_rank_jobs(jobs)

    def job_tags(self, run: str, rank: str) -> dict[str, str]:
        """The job tags the kernel gives the process of (run, rank): its ``host_process`` points carry them too."""
        return self._validator.rank_attribution(run, rank)

    def training_processes(self) -> list[tuple[str, str, int]]:
        """(run, rank, pid) of the live training processes, whose host side the agent samples: the
        registered ones (GPU runs) and those whose run's start point named them (``pid``), GPU or not."""
        regs = {(r.run, r.rank, r.pid) for r in list(self._registrations.values())}
        return sorted(regs | set(list(self._started)))  # a copy first: the reader thread may change it

    def _note_start(self, raw: Any, msg: CheckedPoint) -> bool:
        """Remember the process a ``train_run`` start point names until its end point (or its end).

        Whether the rank's job tags changed (its process was attributed just now)."""
        pid = msg.fields.get("pid")
        if msg.series.measurement != "train_run" or type(pid) is not int:
            return False
        key = (msg.run, str(raw["tags"].get("rank", "0")), pid)  # tags that passed the validator
        if msg.fields.get("event") == "end":
            self._started.pop(key, None)
        elif msg.fields.get("event") == "start" and key not in self._started:
            if len(self._started) >= MAX_STARTED:
                oldest = next(iter(self._started))
                del self._started[oldest]
                self.processes_evicted += 1
                self._log_once(
                    "processes_evicted",
                    logging.WARNING,
                    "training channel: more than %d processes named by runs' start points: run %s rank %s pid %d "
                    "(the oldest) is no longer sampled; further ones are only counted (training_processes_evicted)",
                    MAX_STARTED,
                    *oldest,
                )
            self._started[key] = None
            return self._attribute_rank(*key)
        return False

    def _attribute_rank(self, run: str, rank: str, pid: int) -> bool:
        """Give (run, rank)'s points the job tags of the process that sent this datagram (``pid``, the one it
        names, only when the kernel did not say); whether they changed. Failures are counted."""
        if self._attribute is None:
            return False
        try:
            tags = self._attribute(self._sender if self._sender is not None else pid)
        except Exception as e:
            self._count_once("attribute_failed", repr(e))
            return False
        return tags is not None and self._validator.set_rank_attribution(run, rank, tags)

    def _show(self, raw: Any, msg: CheckedPoint) -> None:
        """Hand a training point to the observer; its failure is counted, never the channel's."""
        if self._observe is None or msg.series.measurement not in OBSERVED:
            return
        try:
            self._observe(msg.series.measurement, {**raw["tags"], "host": self.host}, msg.fields, msg.ts)
        except Exception as e:
            self._count_once("observe_failed", repr(e))

    def gpu_runs(self) -> dict[str, str]:
        """GPU uuid -> run id for the GPUs of registered, live training processes."""
        return dict(self._gpu_runs)

    # -- counting ---------------------------------------------------------------------------------
    def _reject(self, cause: str, detail: str) -> None:
        self.rejected[cause] += 1
        if cause not in self._logged:
            self._logged.add(cause)
            log.warning("training channel: rejected a message (%s: %s); further ones are only counted", cause, detail)

    def _note_dropped_values(self) -> None:
        for cause in self._validator.dropped:
            key = f"value:{cause}"
            if key not in self._logged:
                self._logged.add(key)
                log.warning("training channel: dropped a field value (%s); further ones are only counted", cause)
        over = self._validator.over_budget
        while over:
            log.warning(
                "training channel: run %s sends more than %d distinct log_*/phase_* fields, which is a mistake: "
                "values of further new names are dropped (counted as values_dropped_by_cause.too_many_open_fields)",
                over.pop(),
                MAX_OPEN_FIELDS_PER_RUN,
            )

    def _log_once(self, what: str, level: int, msg: str, *args: Any) -> None:
        """Log ``what`` the first time only (the channel is a leaf: no ``util.countlog`` here)."""
        if what not in self._logged:
            self._logged.add(what)
            log.log(level, msg, *args)

    def _count_once(self, what: str, detail: str) -> None:
        self._log_once(what, logging.ERROR, "training channel: %s: %s (logged once)", what, detail)

    def stats(self) -> dict[str, Any]:
        return {
            "records_received": self.records_received,
            "records_accepted": self.records_accepted,
            "records_rejected": sum(self.rejected.values()),
            "runs_registered": len({r.run for r in self._registrations.values()}),
            "processes_evicted": self.processes_evicted,
            "rejected_by_cause": dict(self.rejected),
            "values_dropped_by_cause": dict(self._validator.dropped),
            "values_dropped_nonfinite": self._validator.dropped["nonfinite"] + self._encoder.nonfinite_dropped,
            "lines_submitted": self.lines_submitted,
            "acks_sent": self.acks_sent,
            "status_replies": self.status_replies,
            "submit_errors": self.submit_errors,
            "clients": len(self._clients),
        }


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
