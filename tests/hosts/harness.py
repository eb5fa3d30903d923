"""Several hosts on one machine: Linux network namespaces joined by a bridge, with faults on demand.

:class:`Hosts` makes ``n`` namespaces, the *hosts*, and one more, the *switch*, that holds a
bridge. Each host has one veth pair: its end is ``eth0`` inside the host (address
``10.213.0.<i>/24`` for host ``i``, counted from 1, and loopback up), the other end is a port of
the switch's bridge. Every interface is made inside a namespace the harness made (``ip -n NS
link add ... netns ...``): nothing is ever added to the machine's own namespace, and the hosts
reach one another and nothing else. Each host has a default route on ``eth0`` that leads nowhere
beyond the bridge, so a program that finds "its address" by routing towards the internet (Ray
does) finds the host's, not loopback.

What a host shares with the others is what separate machines would not: the filesystem, shared
memory, the process table (pids are the machine's). Programs that keep state in a fixed place
(``/tmp/ray``) need a place per host (:meth:`Hosts.home`).

Faults:

- :meth:`Hosts.cut` takes a host off the network (its switch port down: nothing in or out, as a
  pulled cable); :meth:`Hosts.heal` plugs it back in.
- :meth:`Hosts.cut_between` cuts only the link between two hosts: each gets a ``blackhole`` route
  to the other's address (packets are dropped, so a connection hangs as over a partition, rather
  than failing at once); :meth:`Hosts.heal_between` removes the two routes.
- :meth:`Hosts.lose` loses a host: every process in its namespace (``ip netns pids``) gets
  SIGKILL, as when a machine dies, and the host stays cut off until :meth:`Hosts.heal`.

Ownership: namespaces are named ``hwhost-<pid>-<k>-...`` after the process that made them (and a
counter, so one process can hold several :class:`Hosts`). :meth:`Hosts.close` (the context
manager's exit, the pytest fixture's finaliser in ``tests/hosts/conftest.py``) kills every
process left in them, reaps the ones :meth:`Hosts.run` started, and deletes the namespaces,
which takes their interfaces with them; it never raises halfway, so one failure does not leave
the rest behind. A run killed before it could close (SIGKILL, a crash) leaves namespaces whose
owner pid is dead: :func:`sweep_stale`, called whenever a :class:`Hosts` is made, removes them.

Making namespaces needs root (``CAP_SYS_ADMIN``); :func:`unavailable` says why they cannot be
made here, in one line, or ``None``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "hwhost-"
SUBNET = "10.213.0"  # /24, private; lives only inside the harness's namespaces
MASK = 24
KILL_WAIT_S = 5.0
IP_TIMEOUT_S = 10.0
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-(\d+)-")
_counter = itertools.count()


class HostsError(RuntimeError):
    """A namespace, link or route could not be made or changed (the ``ip`` command's words)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["ip", *args],
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (one line), or ``None`` when they can."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    name = f"{PREFIX}{os.getpid()}-probe-{next(_counter)}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "delete", name, check=False)
    return None


def namespaces() -> list[str]:
    """Names of every network namespace on this machine that ``ip netns`` knows."""
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """Pids of the processes whose network namespace is ``namespace``."""
    done = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_all_in(
    namespace: str, wait_s: float = KILL_WAIT_S, keep: frozenset[int] = frozenset()
) -> list[int]:
    """SIGKILL every process in ``namespace`` but those in ``keep`` until none is left (a
    process may fork while the first ones die) or ``wait_s`` passes; the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        pids = [p for p in pids_in(namespace) if p != os.getpid() and p not in keep]
        if not pids or time.monotonic() > deadline:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # zombies stay listed until their parent reaps them


def delete_namespace(namespace: str) -> None:
    """Kill what runs in ``namespace`` and delete it (its interfaces go with it)."""
    kill_all_in(namespace)
    _ip("netns", "delete", namespace, check=False)


def left_behind(before: set[str]) -> set[str]:
    """The harness's namespaces made since ``before`` whose owner process is dead: left behind
    (those of a live owner, a test running beside this one, are its own; a name the harness
    does not make is not a harness's)."""
    left = set()
    for name in set(namespaces()) - before:
        found = _NAME.match(name)
        if found is not None and not _alive(int(found.group(1))):
            left.add(name)
    return left


def sweep_stale() -> list[str]:
    """Delete the harness's namespaces whose owner process is dead; their names."""
    swept = []
    for name in namespaces():
        found = _NAME.match(name)
        if found and not _alive(int(found.group(1))):
            delete_namespace(name)
            swept.append(name)
    return swept


class Hosts:
    """``n`` hosts joined by a bridge (see the module docstring); a context manager.

    Args:
        n: How many hosts (1 to 250).
    """

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"Hosts(n={n!r}): expected 1 to 250 hosts")
        sweep_stale()
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}-{next(_counter)}-"
        self.switch = self.tag + "sw"
        self.names = [f"{self.tag}h{i}" for i in range(1, n + 1)]
        self._started: list[subprocess.Popen] = []
        self._homes: dict[int, Path] = {}
        self._blackholes: set[tuple[int, int]] = set()
        self._closed = False
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names, start=1):
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", name)  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{self.address(i)}/{MASK}", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "route", "add", "default", "dev", "eth0")

    # -- naming ----------------------------------------------------------------------------------

    def _check(self, host: int) -> int:
        if not isinstance(host, int) or not 1 <= host <= self.n:
            raise ValueError(f"host {host!r}: expected 1 to {self.n}")
        if self._closed:
            raise HostsError("these hosts were closed")
        return host

    def address(self, host: int) -> str:
        """Host ``host``'s IP address (hosts are counted from 1)."""
        self._check(host)
        return f"{SUBNET}.{host}"

    def namespace(self, host: int) -> str:
        """The name of host ``host``'s network namespace."""
        return self.names[self._check(host) - 1]

    def home(self, host: int) -> Path:
        """A directory of host ``host``'s own (for state a program keeps in a fixed place on a
        machine), removed with the hosts."""
        self._check(host)
        if host not in self._homes:
            self._homes[host] = Path(tempfile.mkdtemp(prefix=f"hwh{host}-", dir="/tmp"))
        return self._homes[host]

    # -- running ---------------------------------------------------------------------------------

    def argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command line that runs it in host ``host``."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def run(self, host: int, argv: Sequence[str], **popen) -> subprocess.Popen:
        """Start ``argv`` in host ``host`` (``subprocess.Popen`` keywords pass through); it is
        killed and reaped when the hosts close, if it has not exited by then."""
        process = subprocess.Popen(self.argv(host, argv), **popen)
        self._started.append(process)
        return process

    def daemon(self, host: int, argv: Sequence[str], log: str | os.PathLike, **run) -> None:
        """Start ``argv`` in host ``host`` as a daemon: not a child of this process (a server
        that outlives the test that started it, as a machine's services do), its output
        appended to ``log``; it is killed when the hosts close, or lost with its host."""
        with open(log, "ab") as out:
            subprocess.run(
                self.argv(host, ["sh", "-c", 'exec "$@" </dev/null &', "daemon", *argv]),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, check=True,
                timeout=IP_TIMEOUT_S, **run,
            )  # fmt: skip

    def check(self, host: int, argv: Sequence[str], timeout: float = 60.0, **run) -> str:
        """Run ``argv`` in host ``host`` to its end; its stdout. Raises :class:`HostsError`
        (with its stderr) when it exits non-zero."""
        done = subprocess.run(
            self.argv(host, argv), capture_output=True, text=True, timeout=timeout, **run
        )
        if done.returncode != 0:
            raise HostsError(
                f"{' '.join(argv)} in host {host}: exit {done.returncode}: {done.stderr[-2000:]}"
            )
        return done.stdout

    def sent_bytes(self, host: int) -> int:
        """Bytes host ``host`` has sent on its link (``eth0``'s transmit counter) since it was
        made: every byte it sent to another host, none it sent to itself over loopback."""
        table = self.check(host, ["cat", "/proc/net/dev"])
        for line in table.splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "eth0":
                return int(counters.split()[8])  # receive has 8 columns, then transmit bytes
        raise HostsError(f"host {host} has no eth0 in /proc/net/dev")

    def pids(self, host: int) -> list[int]:
        """Pids of the processes running in host ``host``."""
        return pids_in(self.namespace(host))

    # -- faults ----------------------------------------------------------------------------------

    def cut(self, host: int) -> None:
        """Take host ``host`` off the network (its switch port down)."""
        self._check(host)
        _ip("-n", self.switch, "link", "set", f"p{host}", "down")

    def heal(self, host: int) -> None:
        """Put host ``host`` back on the network (its switch port up)."""
        self._check(host)
        _ip("-n", self.switch, "link", "set", f"p{host}", "up")

    def cut_between(self, a: int, b: int) -> None:
        """Cut the link between hosts ``a`` and ``b`` only (a blackhole route in each)."""
        if self._check(a) == self._check(b):
            raise ValueError(f"cut_between({a}, {b}): expected two different hosts")
        for here, there in ((a, b), (b, a)):
            if (here, there) not in self._blackholes:
                _ip("-n", self.namespace(here), "route", "add", "blackhole",
                    f"{self.address(there)}/32")  # fmt: skip
                self._blackholes.add((here, there))

    def heal_between(self, a: int, b: int) -> None:
        """Restore the link between hosts ``a`` and ``b`` (removes :meth:`cut_between`'s routes)."""
        for here, there in ((self._check(a), self._check(b)), (b, a)):
            if (here, there) in self._blackholes:
                _ip("-n", self.namespace(here), "route", "del", "blackhole",
                    f"{self.address(there)}/32")  # fmt: skip
                self._blackholes.discard((here, there))

    def lose(self, host: int) -> list[int]:
        """Lose host ``host``: cut it off, then SIGKILL every process in it; the pids killed.
        It stays off the network until :meth:`heal` (a machine that comes back is a new one)."""
        self.cut(host)
        killed = kill_all_in(self.namespace(host))
        self._reap(0.0)
        return killed

    # -- closing ---------------------------------------------------------------------------------

    def _reap(self, wait_s: float) -> None:
        for process in self._started:
            try:
                process.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Kill every process in the hosts, reap those :meth:`run` started, delete every
        namespace and home. Safe to call twice; never stops halfway on a failure."""
        if self._closed:
            return
        self._closed = True
        for name in [*self.names, self.switch]:
            kill_all_in(name)
        for process in self._started:
            if process.poll() is None:  # started, but its namespace was never entered
                process.kill()
        self._reap(KILL_WAIT_S)
        for name in [*self.names, self.switch]:
            _ip("netns", "delete", name, check=False)
        for home in self._homes.values():
            shutil.rmtree(home, ignore_errors=True)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Hosts(n={self.n}, tag={self.tag!r})"


__all__ = [
    "Hosts",
    "HostsError",
    "PREFIX",
    "delete_namespace",
    "kill_all_in",
    "left_behind",
    "namespaces",
    "pids_in",
    "sweep_stale",
    "unavailable",
]
