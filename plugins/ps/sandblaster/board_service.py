"""The board across processes: the coordinator answers its members' calls as control messages.

A worker group's replicas (its *members*) are processes of their own, placed by the launcher
like any role, possibly on other nodes. They reach the :class:`~.batch.Board` of their
coordinator through the coordinator's control channel (:mod:`hogwild.net.control`, the group
role's own control server, CURVE beyond loopback): each call a replica thread made on the board
(``join``, ``request``, ``fetched``, ``finished``, ``pushed``, ``leave``) is one request, and
``examples`` carries which examples make the current batch. Gradients and parameters never pass
here: members pull and push through the parameter servers, as the threads did.

:class:`BoardService` is the coordinator's side, answering on the control server's network
thread; it never blocks there (``request`` is answered at once, ``wait`` when there is no work,
and the member asks again after a short pause). It keeps, per member:

* its **incarnation** (a random number each member process draws) and a **sequence number**: a
  request the transport resent (its reply lost) is answered again with the reply already given,
  never applied twice (a ``finished`` applied twice would break the scheduler's bookkeeping); a
  ``join`` from a new incarnation (the member restarted) starts its numbering afresh, and the
  earlier incarnation's requests are refused from then on;
* the **board generation** it joined: a new board (the next mini-batch of L-BFGS) forgets every
  member; a member's next request is answered ``join``, and it drops what it had accrued and joins
  again (its vector on the shards is zeroed first, :mod:`.portions`), as a fresh thread did;
* its **last word**: a member silent for longer than ``silence_s`` is taken for gone and leaves
  the board (its portions computed elsewhere); one that speaks again is told to join again. A
  member that died and was restarted joins under its number again, which first removes the dead
  one.

:class:`RemoteBoard` is the member's side, with the board's replica-side methods, so the
:class:`~.replica.SandblasterReplica` loop runs unchanged against it. Every field either side
receives is checked (:func:`hogwild.net.control.field`).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

import numpy as np
from hogwild_plugins.ps.sandblaster.batch import REJOIN, STOP, Board, Rejoin, Stop
from hogwild_plugins.ps.sandblaster.portions import (
    WAIT,
    Compute,
    Fetch,
    Push,
    SchedulerError,
    Wait,
)

from hogwild.net.control import ControlRefused, field

__all__ = ["MEMBER_OPS", "BoardService", "RemoteBoard"]

REPORTS = frozenset({"fetched", "finished", "pushed"})  # answered with the next instruction too
MEMBER_OPS = frozenset({"join", "request", "fetched", "finished", "pushed", "leave", "examples"})
EXAMPLES_CHUNK = 50_000  # example indices per ``examples`` reply (well under the JSON limit)
MAX_SEQ = 2**62
MAX_INDEX = 2**31 - 1
MAX_LOSS = 1e30  # a portion's summed loss; beyond it the member is broken
NON_FINITE = ("nan", "inf", "-inf")
POLL_FIRST_S, POLL_MOST_S = 0.001, 0.005  # a member's pause after ``wait``, doubling


class BoardService:
    """The coordinator's side (see the module docstring).

    Args:
        members: The member numbers this group accepts.
        silence_s: How long a member on the board may say nothing before it is taken for gone.
    """

    def __init__(self, members: range, silence_s: float) -> None:
        self.members, self.silence_s = members, silence_s
        self._lock = threading.Lock()
        self.board: Board | None = None
        self.generation = 0
        self.examples_id = 0
        self.order = np.empty(0, np.int64)
        self.portion = 1
        self.closed = False
        self.joined: set[int] = set()  # members on the current board
        self.seen: dict[int, float] = {}  # member -> its last request (time.monotonic)
        self.replies: dict[int, tuple[int, dict]] = {}  # member -> (its last seq, our reply)
        self.incarnations: dict[int, int] = {}  # member -> the process that speaks for it
        self.kept: dict[int, int] = {m: 0 for m in members}  # portions accepted, all boards
        self.reaped = 0  # members taken for gone after silence

    # -- the coordinator ---------------------------------------------------------------------

    def install(self, board: Board, order: np.ndarray, portion: int) -> None:
        """``board`` is the current one, for a batch of ``order`` in portions of ``portion``;
        the members join it at their next request (the caller closes the old one)."""
        with self._lock:
            self.board = board
            self.generation += 1
            self.joined.clear()
            self._set_examples(order, portion)

    def set_examples(self, order: np.ndarray, portion: int) -> None:
        """The next batch on the same board is ``order`` (set before it begins)."""
        with self._lock:
            self._set_examples(order, portion)

    def _set_examples(self, order: np.ndarray, portion: int) -> None:
        self.order = np.ascontiguousarray(order, dtype=np.int64)
        self.portion = int(portion)
        self.examples_id += 1

    def close(self) -> None:
        """Every member's next request is answered ``stop``."""
        with self._lock:
            self.closed = True

    # -- the network thread ------------------------------------------------------------------

    def answer(self, op: str, body: dict) -> dict:
        """One member's request (see the module docstring).

        Raises:
            ControlRefused: A field out of range, a member number not this group's, an old
                request, or a report that breaks the scheduler's protocol.
        """
        member = field(body, "member", int, minimum=self.members.start,
                       maximum=self.members.stop - 1)  # fmt: skip
        seq = field(body, "seq", int, minimum=0, maximum=MAX_SEQ)
        incarnation = field(body, "incarnation", int, minimum=0, maximum=MAX_SEQ)
        now = time.monotonic()
        with self._lock:
            if incarnation != self.incarnations.get(member, incarnation):
                if op != "join":
                    raise ControlRefused(
                        f"member {member}: incarnation {incarnation} was replaced by "
                        f"{self.incarnations[member]}"
                    )
                self.replies.pop(member, None)  # a new process: its numbering starts again
            self.incarnations[member] = incarnation
            last = self.replies.get(member)
            if last is not None and seq == last[0]:
                return last[1]  # resent by the transport: the reply again, not the act
            if last is not None and seq < last[0]:
                raise ControlRefused(f"member {member}: request {seq} is older than {last[0]}")
            self.seen[member] = now
            self._reap(now)
            try:
                reply = self._act(op, member, body)
                if op in REPORTS and self._current(member, body):  # the next one, at once
                    reply["next"] = self._instruction(self.board.request(member, timeout_s=0.0))
            except SchedulerError as exc:
                raise ControlRefused(f"member {member}: {exc}") from None
            self.replies[member] = (seq, reply)
            return reply

    def _act(self, op: str, member: int, body: dict) -> dict:
        if op == "examples":
            offset = field(body, "offset", int, minimum=0, maximum=len(self.order))
            chunk = self.order[offset : offset + EXAMPLES_CHUNK]
            return {"id": self.examples_id, "portion": self.portion,
                    "total": len(self.order), "order": chunk.tolist()}  # fmt: skip
        if op == "leave":
            error = body.get("error")
            if self.board is not None and member in self.joined:
                self.board.leave(member, error if isinstance(error, str) else None)
            self.joined.discard(member)
            return {"ok": True}
        if op not in MEMBER_OPS:
            raise ControlRefused(f"unknown op {op!r} (members: {', '.join(sorted(MEMBER_OPS))})")
        board = None if self.closed else self.board
        if op == "join":
            if self.closed:
                return {"do": "stop"}
            if board is None:  # no batch yet: it joins the first board when there is one
                return {"generation": 0}
            if member in self.joined:  # a restarted member: the dead one leaves first
                board.leave(member, "joined again (restarted)")
            board.join(member)
            self.joined.add(member)
            return {"generation": self.generation}
        current = self._current(member, body)
        if op == "request":
            if self.closed:
                return {"do": "stop"}
            if board is None:
                return {"do": "wait"}
            if not current:
                return {"do": "join"}
            return self._instruction(board.request(member, timeout_s=0.0))
        batch = field(body, "batch", int, minimum=0, maximum=MAX_SEQ)
        if op == "fetched":
            if current:
                board.fetched(member, batch)
            return {"ok": True}
        if op == "finished":
            portion = field(body, "portion", int, minimum=0, maximum=MAX_INDEX)
            keep = current and board.finished(member, batch, portion, _loss(body))
            if keep:
                self.kept[member] += 1
            return {"keep": bool(keep)}
        portions = body.get("portions")  # op == "pushed"
        if not isinstance(portions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= MAX_INDEX for p in portions
        ):
            raise ControlRefused("field 'portions': expected a list of portion numbers")
        if current:
            board.pushed(member, batch, tuple(portions))
        return {"ok": True}

    def _current(self, member: int, body: dict) -> bool:
        """Whether ``member`` speaks of the current board, which it is on (lock held)."""
        generation = field(body, "generation", int, minimum=0, maximum=MAX_SEQ)
        return (
            not self.closed
            and self.board is not None
            and generation == self.generation
            and member in self.joined
        )

    def _instruction(self, instruction) -> dict:
        if isinstance(instruction, Fetch):
            return {"do": "fetch", "batch": instruction.batch, "examples": self.examples_id}
        if isinstance(instruction, Compute):
            return {"do": "compute", "batch": instruction.batch, "portion": instruction.portion,
                    "backup": instruction.backup}  # fmt: skip
        if isinstance(instruction, Push):
            return {"do": "push", "batch": instruction.batch,
                    "portions": list(instruction.portions)}  # fmt: skip
        if isinstance(instruction, Stop):
            return {"do": "stop"}
        return {"do": "wait"}

    def _reap(self, now: float) -> None:
        """Members on the board silent for longer than ``silence_s`` leave it (lock held)."""
        for member in [m for m in self.joined if now - self.seen.get(m, now) > self.silence_s]:
            self.joined.discard(member)
            self.reaped += 1
            if self.board is not None:
                self.board.leave(member, f"silent for more than {self.silence_s:g} s")


def _loss(body: dict) -> float:
    """A portion's summed loss: a number, or ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has none
    of them; a trial step of the line search may overflow, and the coordinator must see it)."""
    loss = body.get("loss")
    if loss in NON_FINITE:
        return float(loss)
    return float(field(body, "loss", (int, float), minimum=-MAX_LOSS, maximum=MAX_LOSS))


class RemoteBoard:
    """A member's way to its coordinator's board (see the module docstring).

    Args:
        call: ``call(op, **body) -> dict``: a control client of the coordinator's
            (:meth:`hogwild.net.control.ControlClient.call`).
        on_examples: Called with ``(order, portion)`` when a batch's examples change, before
            the member computes on them.
    """

    def __init__(self, call: Callable[..., dict], on_examples: Callable) -> None:
        self.call, self.on_examples = call, on_examples
        self.member: int | None = None
        self.generation = -1
        self.examples_id = -1
        self.seq = 0
        self.incarnation = secrets.randbits(62)
        self.next: dict | None = None  # the instruction a report's reply carried

    def _send(self, op: str, **body) -> dict:
        self.seq += 1
        return self.call(op, member=self.member, incarnation=self.incarnation, seq=self.seq, **body)

    def join(self, replica: int) -> None:
        self.member = replica
        reply = self._send("join")
        if reply.get("do") == "stop":  # its next request is answered stop as well
            self.generation = 0
            return
        self.generation = field(reply, "generation", int, minimum=0, maximum=MAX_SEQ)

    def leave(self, replica: int, error: str | None = None) -> list[int]:
        """Report an ``error`` that ends the member, if the coordinator can still be reached.
        A member told to stop, or stopped by its launcher (the job ending: its coordinator may
        be gone already), says nothing: the coordinator takes a silent member for gone, and
        backs up the portion it was computing meanwhile."""
        if error:
            try:
                self._send("leave", error=error[:500])
            except Exception:  # noqa: BLE001 - leaving: the coordinator may be gone already
                pass
        return []

    def request(self, replica: int, timeout_s: float = 1.0) -> Fetch | Compute | Push | Wait | Stop:
        """The member's next instruction, asking again after a pause while there is none."""
        deadline = time.monotonic() + timeout_s
        pause = POLL_FIRST_S
        while True:
            reply, self.next = self.next, None
            if reply is None:
                reply = self._send("request", generation=self.generation)
            instruction = self._decode(reply)
            if not isinstance(instruction, Wait) or time.monotonic() + pause > deadline:
                return instruction
            time.sleep(pause)
            pause = min(pause * 2, POLL_MOST_S)

    def _decode(self, reply: dict) -> Fetch | Compute | Push | Wait | Stop | Rejoin:
        do = reply.get("do")
        if do == "wait":
            return WAIT
        if do == "stop":
            return STOP
        if do == "join":
            return REJOIN
        batch = field(reply, "batch", int, minimum=0, maximum=MAX_SEQ)
        if do == "fetch":
            wanted = field(reply, "examples", int, minimum=0, maximum=MAX_SEQ)
            if wanted != self.examples_id:
                self._examples()
            return Fetch(batch)
        if do == "compute":
            portion = field(reply, "portion", int, minimum=0, maximum=MAX_INDEX)
            return Compute(batch, portion, bool(reply.get("backup")))
        if do == "push":
            portions = reply.get("portions")
            if not isinstance(portions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in portions
            ):
                raise ControlRefused(f"the coordinator's push: portions {portions!r:.80}")
            return Push(batch, tuple(portions))
        raise ControlRefused(f"the coordinator's answer {reply!r:.120}: expected an instruction")

    def _examples(self) -> None:
        """The current batch's examples, in chunks; ``on_examples`` with them."""
        parts, offset, first = [], 0, None
        while True:
            reply = self._send("examples", offset=offset)
            got = field(reply, "id", int, minimum=0, maximum=MAX_SEQ)
            total = field(reply, "total", int, minimum=0, maximum=MAX_INDEX)
            portion = field(reply, "portion", int, minimum=1, maximum=MAX_INDEX)
            order = reply.get("order")
            if not isinstance(order, list):
                raise ControlRefused("the coordinator's examples: no 'order' list")
            if first is not None and got != first:  # the batch moved on meanwhile: again
                parts, offset, first = [], 0, None
                continue
            first = got
            parts.append(np.asarray(order, dtype=np.int64))
            offset += len(order)
            if offset >= total or not order:
                break
        whole = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if len(whole) != total:
            raise ControlRefused(f"the coordinator's examples: {len(whole)} of {total}")
        self.on_examples(whole, portion)
        self.examples_id = first

    def _report(self, op: str, **body) -> dict:
        """A report; the next instruction its reply carries is kept for :meth:`request`."""
        reply = self._send(op, generation=self.generation, **body)
        following = reply.get("next")
        self.next = following if isinstance(following, dict) else None
        return reply

    def fetched(self, replica: int, batch: int) -> None:
        self._report("fetched", batch=batch)

    def finished(self, replica: int, batch: int, portion: int, loss: float) -> bool:
        reply = self._report("finished", batch=batch, portion=portion,
                             loss=_finite_or_named(loss))  # fmt: skip
        return field(reply, "keep", bool)

    def pushed(self, replica: int, batch: int, portions: tuple[int, ...]) -> None:
        self._report("pushed", batch=batch, portions=list(portions))


def _finite_or_named(loss: float) -> float | str:
    loss = float(loss)
    return loss if np.isfinite(loss) else str(loss)
