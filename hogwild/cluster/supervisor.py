"""Role supervision: which roles of a cluster job come back when they die, and when the job stops.

:class:`RestartPolicy` decides, and does no I/O (dask's worker state machine is the model): the
driver feeds it what the launcher saw (:class:`RoleExited`), asks it what to do now
(:class:`Recover`) and reports how each restart went (:class:`Restarted`,
:class:`RestartFailed`), each stimulus with an id; it answers actions
(:class:`ForgetServer`, :class:`Fence`, :class:`Restart`, :class:`StopJob`), keeps a bounded
log of its transitions (:meth:`story`) and checks its own invariants (:meth:`validate_state`).
:class:`Supervisor` is the thin adapter that carries the actions out through the launcher and
the driver's callbacks.

What it decides:

- **Who is supervised**: a role the driver registers (:class:`Supervised`): every replica and
  data server, and the parameter servers when they keep copies (``cluster.copies > 1``: a dead
  server's buckets fail over and it rejoins and catches up). A parameter server with one copy
  is not: its state dies with it.
- **Restarts**: a supervised role that exited comes back while it has been restarted fewer than
  ``cluster.restarts`` times; the restarts of one :class:`Recover` go in tiers, servers first
  (parameter and data servers together: neither reads from the other, and each waits alike for
  a lost node's return), then replicas (a replica starting reads from both), then groups'
  members: the roles of one tier (a host's roles lost together) start side by side and are
  waited for together, the next tier once they are up or failed. A restart that does
  not start counts, and the role is restarted again at the next :class:`Recover` while restarts
  remain.
- **Readers wait for their data**: a replica or a group's member (roles that read from the
  job's data servers) is not restarted while every data server is silent (the driver asks them
  before each :class:`Recover`): a data server lost with its host comes back only through a
  restart here, which a replica's start waiting for it (``data.wait_s``) would hold up, since
  a round's tiers go one after another; such a start would fail after its wait and cost a
  second restart.
  The readers wait while a data server is gone (its restart comes first) and otherwise up to
  ``data.wait_s`` (the launcher may not yet know that the data server's host is lost), then are
  restarted as usual. A replica held is fenced at once (:class:`Fence`: the servers refuse its
  old incarnation, which may still run behind a partition, and the coordinator gives its
  portions to others), not at its restart, which then only starts the process. The story says
  when a hold began and why it ended (not every data server was silent: one answered or the
  probe failed; or ``data.wait_s`` ran out).
- **Failover at once**: a replicated parameter server that exited has its lease ended now
  (:class:`ForgetServer`), so its buckets fail over without waiting for the lease to lapse;
  one lost with no exit seen (its process may still run) has that end marked, and the takeovers
  of its buckets wait out a lease before they answer reads.
- **Stopping**: one exited role that will not come back (not supervised, past its restarts, or
  stopped by a parameter server: it exited :data:`~hogwild.errors.EXIT_STOPPED`, its bucket
  refused there until the server is restarted, which no restart of the role helps) stops the
  job, with one message naming every role that exited, why each is not restarted (a stopped
  role's last error line: the server, the bucket and why), and where the last checkpoint is
  kept.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from hogwild.cluster.launcher import RoleExit
from hogwild.cluster.roles import KINDS
from hogwild.errors import RoleFailedError
from hogwild.logs import role_logger

__all__ = [
    "Fence",
    "ForgetServer",
    "Recover",
    "Restart",
    "RestartFailed",
    "RestartPolicy",
    "Restarted",
    "RoleExited",
    "StopJob",
    "Supervised",
    "Supervisor",
]

# each kind's tier in one round of restarts: a tier starts side by side, after the one before
TIER_OF_KIND = {"ps": 0, "data": 0, "replica": 1, "member": 2}
READERS = ("replica", "member")  # the kinds that read from the job's data servers
STORY_LENGTH = 1000  # transitions kept by RestartPolicy.story()
RUNNING, EXITED, RESTARTING = "running", "exited", "restarting"
# why a story entry of a held reader was written (its fifth field; its state stays EXITED)
HELD = "held: every data server silent"
HOLD_NOT_SILENT = "hold ended: not every data server silent (one answered, or the probe failed)"
HOLD_TIMED_OUT = "hold ended: data.wait_s ran out with every data server silent"


# -- stimuli -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Supervised:
    """Role ``name`` (of ``kind``, number ``index`` of its kind) is started and comes back when
    it dies."""

    name: str
    kind: str
    index: int
    stimulus_id: str


@dataclass(frozen=True)
class RoleExited:
    """The launcher saw a role exit (each exit is reported once)."""

    exit: RoleExit
    stimulus_id: str


@dataclass(frozen=True)
class Recover:
    """The driver asks what to do about the roles that exited; ``data_silent``: every data
    server of the job was asked and none answered (asked only while a reader awaits its
    restart), at ``now`` (monotonic seconds)."""

    stimulus_id: str
    data_silent: bool = False
    now: float = 0.0


@dataclass(frozen=True)
class Restarted:
    """A restart (:class:`Restart`) started the role and it serves."""

    name: str
    stimulus_id: str


@dataclass(frozen=True)
class RestartFailed:
    """A restart did not start the role (``why`` is what the launcher said)."""

    name: str
    host: str
    why: str
    stimulus_id: str


# -- actions -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetServer:
    """End replicated parameter server ``index``'s lease now; ``lost``: no exit was seen (its
    node or actor was lost), so its process may still run and answer reads by its own lease
    clock (the lease's end is marked: takeovers wait out a lease for reads)."""

    index: int
    lost: bool = False


@dataclass(frozen=True)
class Fence:
    """Replica ``index`` (role ``name``) is held, its restart waiting for a data server: fence
    its incarnation on the servers and give its portions up now (it may still run, cut off)."""

    name: str
    index: int


@dataclass(frozen=True)
class Restart:
    """Start role ``name`` again; this is its ``count``-th restart of ``limit``; ``exit`` is how
    it ended; ``fenced``: a replica fenced already while held (:class:`Fence`), only to be
    started. Answer :class:`Restarted` or :class:`RestartFailed`."""

    name: str
    kind: str
    index: int
    count: int
    limit: int
    exit: RoleExit
    fenced: bool = False


@dataclass(frozen=True)
class StopJob:
    """Stop the job: a role that exited will not come back (``reason`` names every exit)."""

    reason: str


@dataclass(frozen=True)
class _Role:
    kind: str
    index: int


class RestartPolicy:
    """The restart decisions of one job (see the module docstring).

    Args:
        limit: ``cluster.restarts``: the most restarts of one role.
        kept: Where the last checkpoint is kept (``output.checkpoint_dir``; "" if none), for
            the message that stops the job.
        data_wait_s: ``data.wait_s``: the longest a reader's restart waits for a silent data
            server while none is known gone.
    """

    def __init__(self, limit: int, kept: str = "", data_wait_s: float = 0.0) -> None:
        self.limit, self.kept, self.data_wait_s = limit, kept, data_wait_s
        self.roles: dict[str, _Role] = {}  # the supervised roles
        self.state: dict[str, str] = {}  # a supervised role's: running, exited, restarting
        self.exits: dict[str, RoleExit] = {}  # roles exited and not yet restarted, in order
        self.gone: set[str] = set()  # roles exited and not back yet (restarting included)
        self.restarts: dict[str, int] = {}  # restarts so far, by role
        self.held: set[str] = set()  # readers exited whose restart waits for a data server
        self.fenced: set[str] = set()  # replicas fenced while held, not restarted since
        self.silent_since: float | None = None  # when the data servers were first found silent
        self._story: deque[tuple] = deque(maxlen=STORY_LENGTH)

    # -- queries ---------------------------------------------------------------------------------

    def restartable(self, name: str) -> bool:
        """Supervised, below its restarts, and not stopped by a parameter server."""
        exit_ = self.exits.get(name)
        if exit_ is not None and exit_.stopped:
            return False
        return name in self.roles and self.restarts.get(name, 0) < self.limit

    def readers_waiting(self) -> bool:
        """A replica or member awaits its restart (the driver then asks the data servers)."""
        return any(self.roles[n].kind in READERS for n in self.exits if n in self.roles)

    def awaiting_restart(self, name: str) -> bool:
        """Exited, and will be restarted at the next :class:`Recover`: nobody to ask now."""
        return name in self.exits and self.restartable(name)

    def story(self, name: str | None = None) -> list[tuple]:
        """The transitions, oldest first, each ``(stimulus_id, role, before, after, why)``:
        ``why`` None but for a hold's start and end (``EXITED`` to ``EXITED``: :data:`HELD`,
        :data:`HOLD_NOT_SILENT`, :data:`HOLD_TIMED_OUT`); with ``name``, that role's only."""
        return [t for t in self._story if name is None or t[1] == name]

    # -- the one entry -----------------------------------------------------------------------------

    def handle(self, stimulus) -> list:
        """Take one stimulus; the actions to carry out, in order."""
        if isinstance(stimulus, Supervised):
            self.roles[stimulus.name] = _Role(stimulus.kind, stimulus.index)
            self._move(stimulus.stimulus_id, stimulus.name, RUNNING)
            return []
        if isinstance(stimulus, RoleExited):
            return self._exited(stimulus.exit, stimulus.stimulus_id)
        if isinstance(stimulus, Recover):
            return self._recover(stimulus)
        if isinstance(stimulus, Restarted):
            self._expect(stimulus.name, RESTARTING)
            self.gone.discard(stimulus.name)
            self._move(stimulus.stimulus_id, stimulus.name, RUNNING)
            return []
        if isinstance(stimulus, RestartFailed):
            self._expect(stimulus.name, RESTARTING)  # its next death: restarted again, if it may
            self.exits[stimulus.name] = RoleExit(stimulus.name, stimulus.host, None, stimulus.why)
            self._move(stimulus.stimulus_id, stimulus.name, EXITED)
            return []
        raise TypeError(f"not a stimulus of the restart policy: {stimulus!r}")

    def _exited(self, exit_: RoleExit, stimulus_id: str) -> list:
        name = exit_.name
        self.exits.setdefault(name, exit_)
        self.gone.add(name)
        role = self.roles.get(name)
        if role is None:  # not supervised: the next Recover stops the job
            self._story.append((stimulus_id, name, None, EXITED, None))
            return []
        self._move(stimulus_id, name, EXITED)
        lost = exit_.returncode is None  # no exit seen: the process may still run
        return [ForgetServer(role.index, lost)] if role.kind == "ps" else []

    def _recover(self, recover: Recover) -> list:
        stimulus_id = recover.stimulus_id
        if any(not self.restartable(name) for name in self.exits):
            return [StopJob(self._why_stopped())]
        hold = self._hold_readers(recover)
        actions = []
        by_tier = sorted(
            self.exits,
            key=lambda n: (
                TIER_OF_KIND[self.roles[n].kind],
                KINDS.index(self.roles[n].kind),  # within a tier: parameter, then data servers
                self.roles[n].index,
            ),
        )
        for name in by_tier:  # a tier's roles by index, whatever order their exits were seen in
            role = self.roles[name]
            if hold and role.kind in READERS:
                if name not in self.held:  # once in the story, not at every Recover
                    self.held.add(name)
                    self._story.append((stimulus_id, name, EXITED, EXITED, HELD))
                    if role.kind == "replica" and name not in self.fenced:
                        self.fenced.add(name)  # fenced now; its restart only starts it
                        actions.append(Fence(name, role.index))
                continue
            if name in self.held:
                self.held.discard(name)
                why = HOLD_TIMED_OUT if recover.data_silent else HOLD_NOT_SILENT
                self._story.append((stimulus_id, name, EXITED, EXITED, why))
            exit_ = self.exits.pop(name)
            count = self.restarts[name] = self.restarts.get(name, 0) + 1
            self._move(stimulus_id, name, RESTARTING)
            fenced = name in self.fenced
            self.fenced.discard(name)
            actions.append(
                Restart(name, role.kind, role.index, count, self.limit, exit_, fenced=fenced)
            )
        return actions

    def _hold_readers(self, recover: Recover) -> bool:
        """Whether the readers that exited wait (see the module docstring): while every data
        server is silent, as long as one is gone (restarted first, in this round if it exited)
        or, none known gone, for ``data_wait_s`` since they were first found silent."""
        if not recover.data_silent:
            self.silent_since = None
            return False
        if self.silent_since is None:
            self.silent_since = recover.now
        if any(self.roles[n].kind == "data" for n in self.gone if n in self.roles):
            return True
        return recover.now - self.silent_since < self.data_wait_s

    def _why_stopped(self) -> str:
        def told(exit_: RoleExit) -> str:
            if exit_.stopped:
                said = f": {exit_.said}" if exit_.said else ""
                return (
                    f"{exit_.name} on {exit_.host} was stopped by its parameter server{said} "
                    "(not restarted: the server refuses the bucket until it is restarted)"
                )
            if not self.limit or self.restartable(exit_.name):
                return exit_.describe()
            if exit_.name not in self.roles:
                return f"{exit_.describe()} (a parameter server is not restarted)"
            return f"{exit_.describe()} (restarted {self.limit} times already: cluster.restarts)"

        kept = f" and the last checkpoint in {self.kept} is kept" if self.kept else ""
        return "; ".join(told(e) for e in self.exits.values()) + "; the job is stopped" + kept

    def _expect(self, name: str, state: str) -> None:
        if self.state.get(name) != state:
            raise ValueError(f"{name} is {self.state.get(name, 'not supervised')}, not {state}")

    def _move(self, stimulus_id: str, name: str, after: str) -> None:
        before = self.state.get(name)
        self.state[name] = after
        self._story.append((stimulus_id, name, before, after, None))

    def validate_state(self) -> None:
        """Raise AssertionError if an invariant does not hold (tests call it after every step)."""
        assert set(self.state) == set(self.roles), (self.state, self.roles)
        for name, state in self.state.items():
            assert state in (RUNNING, EXITED, RESTARTING), (name, state)
            assert (state == EXITED) == (name in self.exits), (name, state)
            assert (state != RUNNING) == (name in self.gone), (name, state)
        assert set(self.exits) <= self.gone, (self.exits, self.gone)
        assert self.held <= set(self.exits), (self.held, self.exits)
        assert not self.held or self.silent_since is not None, (self.held, self.silent_since)
        assert self.fenced <= set(self.exits), (self.fenced, self.exits)
        assert all(self.roles[n].kind == "replica" for n in self.fenced), self.fenced
        assert all(self.roles[n].kind in READERS for n in self.held), self.held
        assert all(0 < n <= self.limit for n in self.restarts.values()), self.restarts
        assert set(self.restarts) <= set(self.roles), self.restarts
        for name, exit_ in self.exits.items():
            assert exit_.name == name, (name, exit_)


class Supervisor:
    """Carries out :class:`RestartPolicy`'s actions (see the module docstring).

    Args:
        policy: The decisions.
        launcher: The job's launcher (``poll``, ``restart``).
        forget_server: Ends a replicated parameter server's lease (``ForgetServer``).
        start_again: Starts a role again (a :class:`Restart`) and returns its address once it
            serves; raises :class:`~hogwild.errors.RoleFailedError` when it does not start.
        back: Called with the :class:`Restart` and the address once the role is back (what
            it raises stops the job).
        data_silent: Asks the job's data servers; True when none answers (None: the job runs
            none of its own, and readers are never held).
        fence: Fences a held replica now (a :class:`Fence`; required when readers may be held).
        start_together: Starts one tier's roles again side by side (a list of
            :class:`Restart` of one tier: :data:`TIER_OF_KIND`) and returns, in order, each
            one's address or the :class:`~hogwild.errors.RoleFailedError` saying why it did not
            start: returned, never raised (one it raises stops the job) (None: each through
            ``start_again``, one after another).
    """

    def __init__(
        self,
        policy: RestartPolicy,
        launcher,
        forget_server: Callable[[int, bool], None],
        start_again: Callable[[Restart], str],
        back: Callable[[Restart, str], None],
        data_silent: Callable[[], bool] | None = None,
        fence: Callable[[Fence], None] | None = None,
        start_together: Callable[[list[Restart]], list[str | RoleFailedError]] | None = None,
    ) -> None:
        if data_silent is not None and fence is None:
            raise ValueError("a supervisor that holds readers (data_silent) needs fence")
        self.policy, self.launcher, self.data_silent = policy, launcher, data_silent
        self.fence = fence
        self.forget_server, self.start_again, self.back = forget_server, start_again, back
        self.start_together = start_together
        self.stimuli = 0

    def _id(self, what: str) -> str:
        self.stimuli += 1
        return f"{what}-{self.stimuli}"

    def supervise(self, name: str, kind: str, index: int) -> None:
        self.policy.handle(Supervised(name, kind, index, self._id("started")))

    def poll(self) -> None:
        """Tell the policy the roles the launcher saw exit (each is reported by it once)."""
        for exit_ in self.launcher.poll():
            self._do(self.policy.handle(RoleExited(exit_, self._id("exit"))))

    def check(self) -> None:
        """Stop the job (:class:`~hogwild.errors.RoleFailedError`) if a role that exited will
        not come back; restart nothing."""
        self.poll()
        if any(not self.policy.restartable(name) for name in self.policy.exits):
            self._do(self.policy.handle(Recover(self._id("check"))))

    def recover(self) -> None:
        """Restart the roles that exited, or stop the job."""
        self.poll()
        silent = (
            self.data_silent is not None and self.policy.readers_waiting() and self.data_silent()
        )
        held = set(self.policy.held)
        actions = self.policy.handle(Recover(self._id("recover"), silent, time.monotonic()))
        for name in sorted(self.policy.held - held):  # said once per wait
            role_logger("cluster").warning("%s: no data server answers; its restart waits", name)
        self._do(actions)

    def _do(self, actions: list) -> None:
        """Carry ``actions`` out in order; a run of :class:`Restart` of one tier
        (:data:`TIER_OF_KIND`: the policy orders them) starts side by side, the next tier once
        it is done."""
        for (restarting, _), run in itertools.groupby(
            actions,
            key=lambda a: (isinstance(a, Restart), TIER_OF_KIND.get(getattr(a, "kind", None))),
        ):
            if restarting:
                self._restart_tier(list(run))
                continue
            for action in run:
                if isinstance(action, ForgetServer):
                    self.forget_server(action.index, action.lost)
                elif isinstance(action, Fence):
                    self.fence(action)
                elif isinstance(action, StopJob):
                    raise RoleFailedError(action.reason)

    def _restart_tier(self, tier: list[Restart]) -> None:
        """Start ``tier`` again and tell the policy how each went, in the tier's order; then
        each one back. A restart that failed is restarted again while restarts remain (at the
        next round, after the data servers: a replica may not start while none answers)."""
        if self.start_together is not None:
            results = self.start_together(tier)
            if len(results) != len(tier):
                raise ValueError(f"{len(results)} results for {len(tier)} restarts: {results}")
        else:
            results = [self._start_one(restart) for restart in tier]
        for restart, result in zip(tier, results, strict=True):
            if isinstance(result, RoleFailedError):
                why, host = str(result), restart.exit.host
                self.policy.handle(RestartFailed(restart.name, host, why, self._id("failed")))
            else:
                self.policy.handle(Restarted(restart.name, self._id("restarted")))
        for restart, result in zip(tier, results, strict=True):
            if not isinstance(result, RoleFailedError):
                self.back(restart, result)

    def _start_one(self, restart: Restart) -> str | RoleFailedError:
        try:
            return self.start_again(restart)
        except RoleFailedError as exc:
            return exc
