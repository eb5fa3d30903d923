"""Launchers: what starts, watches and stops a cluster job's roles, chosen by name.

A launcher is registered in the entry-point group ``hogwild.launchers`` (``cluster.launcher``
names one): ``local`` (processes on this host, :mod:`hogwild.cluster.local`) is the engine's,
``ray`` comes from the Ray plugin. The driver uses a launcher only through :class:`Launcher`:

- :meth:`~Launcher.reserve` addresses for the roles whose ports must be known before they start
  (the parameter servers: each is told the whole list);
- :meth:`~Launcher.start` a role and wait until it printed its ready line (its address), or
  :meth:`~Launcher.start_all` several, which need not wait for each other;
- :meth:`~Launcher.poll` which roles have exited (:class:`RoleExit`: the role, its host, its exit
  status or signal), so the driver restarts them or stops the job with an error naming them;
- :meth:`~Launcher.restart` a role that exited: what is left of it (its workers) is stopped,
  then it is started again from the same spec and waited for, as :meth:`~Launcher.start`;
  :meth:`~Launcher.restart_all` several (one tier of a round of restarts) side by side, each
  one's success or failure its own;
- with a roster of the job's keys (:attr:`Launcher.job_keys`,
  :mod:`hogwild.cluster.identities`), each role's key pair is made where it will run before it
  starts, its public key and address entered in the roster;
- :meth:`~Launcher.stop_all`: replicas first, then data servers, then parameter servers (which
  flush on SIGTERM), each asked to stop, then killed after ``stop_timeout_s``; nothing is left
  behind, whatever state the job is in. A launcher is a context manager that stops all on exit.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hogwild.cluster.roles import RoleSpec
from hogwild.entry_points import load
from hogwild.errors import EXIT_STOPPED, RoleFailedError

GROUP = "hogwild.launchers"
STOP_ORDER = ("member", "replica", "data", "ps")
__all__ = [
    "ERROR_PREFIX",
    "GROUP",
    "STOP_ORDER",
    "Launcher",
    "RoleExit",
    "RoleFailedError",
    "launcher_class",
    "said_in",
]


ERROR_PREFIX = "hogwild: error: "  # how the CLI says why it failed, one line


def said_in(lines) -> str:
    """The last error line the CLI printed among a role's last ``lines`` of stderr, without its
    prefix ("" if none): what a role that exited :data:`~hogwild.errors.EXIT_STOPPED` said."""
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    return errors[-1][len(ERROR_PREFIX) :] if errors else ""


@dataclass(frozen=True)
class RoleExit:
    """A role that is gone: which, where, and how it ended."""

    name: str
    host: str
    returncode: int | None  # None: its node or actor was lost without a status
    why: str = ""  # what the driver saw instead (a restart that did not start)
    said: str = ""  # its last error line (``hogwild: error: ...``), where the launcher has it

    @property
    def stopped(self) -> bool:
        """It exited with :data:`~hogwild.errors.EXIT_STOPPED`: a parameter server stopped its
        bucket, which no restart of this role helps."""
        return self.returncode == EXIT_STOPPED

    def describe(self) -> str:
        if self.why:
            return self.why
        code = self.returncode
        if code is None:
            how = "was lost (its node or actor is gone)"
        elif code < 0 and -code in signal.valid_signals():
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        return f"{self.name} on {self.host} {how}"


class Launcher(ABC):
    """Starts a job's roles somewhere, watches them, stops them (see the module docstring)."""

    def __init__(self, config, run_dir: str) -> None:
        self.config, self.run_dir = config, run_dir
        self.job_keys = None  # the job's roster (a key pair per role), set by the driver

    @abstractmethod
    def reserve(self, specs: list[RoleSpec], host: str) -> list[str]:
        """``HOST:PORT`` for each of ``specs``, free where each will run."""

    @abstractmethod
    def start(self, spec: RoleSpec) -> str:
        """Start ``spec`` and wait for its ready line; its ``HOST:PORT``.

        Raises:
            RoleFailedError: It exited or stayed silent past ``cluster.start_timeout_s``.
        """

    def start_all(self, specs: list[RoleSpec]) -> list[str]:
        """Start every one of ``specs`` and wait for all their ready lines; their ``HOST:PORT``,
        in order. Roles of one tier do not wait for each other, so a launcher that can start
        them at once should (they load their kernels side by side); this one starts them one
        after another.

        Raises:
            RoleFailedError: One exited or stayed silent past ``cluster.start_timeout_s`` (the
                others started are stopped with the job, as every started role is).
        """
        return [self.start(spec) for spec in specs]

    @abstractmethod
    def poll(self) -> list[RoleExit]:
        """The roles that have exited since they started (each reported once)."""

    @abstractmethod
    def kill(self, name: str) -> bool:
        """SIGKILL role ``name`` (its process group: its workers too), which the driver took
        for dead while it did not exit (it stopped answering); whether the signal was sent.
        :meth:`poll` reports the exit."""

    def restart(self, spec: RoleSpec) -> str:
        """Start ``spec`` again once :meth:`poll` reported it gone; its ``HOST:PORT``.

        What is left of the role (workers its death orphaned) is stopped first; the new one is
        watched, reported and stopped like any other.

        Raises:
            RoleFailedError: This launcher cannot restart roles, or the role did not start.
        """
        raise RoleFailedError(f"the {type(self).__name__} cannot restart {spec.name}")

    def restart_all(self, specs: list[RoleSpec]) -> list[str | RoleFailedError]:
        """:meth:`restart` every one of ``specs`` (roles of one tier: none waits for another);
        each one's ``HOST:PORT`` or the :class:`RoleFailedError` saying why it did not start,
        in order. A launcher that can start them side by side should (a host's roles lost
        together come back together); this one restarts them one after another."""
        results: list[str | RoleFailedError] = []
        for spec in specs:
            try:
                results.append(self.restart(spec))
            except RoleFailedError as exc:
                results.append(exc)
        return results

    @abstractmethod
    def stop_all(self, grace_s: float = 0.0) -> None:
        """Stop every role (see the module docstring); safe to call twice.

        ``grace_s``: seconds the replicas get to leave by themselves (they were asked to stop)
        before they are sent SIGTERM.
        """

    def hosts(self) -> dict[str, str]:
        """Role name -> the host it runs on."""
        return {}

    def describe(self) -> list[dict]:
        """Each role started: its name, host and (where the launcher knows it) process id."""
        return [{"name": name, "host": host} for name, host in self.hosts().items()]

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def launcher_class(name: str):
    """The launcher registered as ``name``.

    Raises:
        PluginMissing: No such launcher, or its plugin cannot be imported (says what to
            install; a :class:`~hogwild.errors.ConfigError`).
    """
    return load(GROUP, name, chosen_by="cluster.launcher")
