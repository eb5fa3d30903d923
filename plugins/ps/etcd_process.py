"""etcd servers on loopback, owned by a job or a test: one (:class:`EtcdProcess`) or a cluster
of members that survives losing one (:class:`EtcdCluster`).

OS mechanics only (ports, a data directory, a child that dies with us, a bounded start and
stop); :mod:`hogwild_plugins.ps.etcd` is the client, and re-exports what is here. etcd is the
controller of the replicated parameter server (Adam, section 3.3.3), so the servers started here
are tuned for leases of about a second on one LAN: etcd never grants a lease shorter than 1.5
election timeouts, and a lease ends late by up to an election and one more election timeout
when its holder's host led etcd (the others elect a leader, and a new leader extends every
lease by an election timeout), so the election timeout here is :data:`ELECTION_MS` (etcd's
default is 1,000 ms), the heartbeat a tenth of it, with raft's pre-vote on (:data:`PRE_VOTE`).

Every server's work directory (data and log) is ``hogwild-etcd-<owner pid>-*`` in the temporary
directory, removed by ``stop``. A server dies with its owner even when the owner is SIGKILLed
(Linux's parent-death signal); the directory such an owner left is removed by the next start
(:func:`sweep_stale_work`), since nobody else would.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hogwild_plugins.ps.etcd_tls import EtcdTls

from hogwild.errors import HogwildError
from hogwild.net.address import host_port
from hogwild.net.ports import free_port
from hogwild.signals import process_exists

__all__ = [
    "ELECTION_MS",
    "INSTALL_HINT",
    "PRE_VOTE",
    "EtcdCluster",
    "EtcdProcess",
    "etcd_binary",
    "heartbeat_ms",
    "sweep_stale_work",
]

ELECTION_MS = 200
"""The election timeout of the etcd members started here, in milliseconds (the heartbeat a tenth
of it). A primary's host cut off while its etcd member leads costs its lease up to 2 election
timeouts (the election) and one more (etcd extends every lease by one when a new leader takes
over) on top of the TTL: at etcd's 1,000 ms default 3 s more, at 500 ms up to 1.5 s (a 1 s lease
was gone 2.2 to 2.5 s after such a cut: bench/results/partitions_cuts_quiet_lease1.json), at
200 ms 0.6 s. etcd asks for at least 10 round trips between members: a LAN's is under 1 ms. A
shorter timeout costs idle heartbeats' CPU and makes a starved member's campaign likelier
(raft's pre-vote, :data:`PRE_VOTE`, keeps one from deposing a healthy leader). Both, per election
timeout, come from ``bench/figures/etcd_election.py`` (the lease's end after the leader's stop,
the first read answered, a survivor's keepalives, idle CPU-s a second;
``bench/results/etcd_election.json``): at 200 ms a survivor's 1 s lease outlives the leader's
stop, at 500 ms it did not, and an idle three-member cluster costs about twice the CPU of 500 ms
and two thirds of 100 ms'. Leases of 1 s are honoured (etcd's floor, 1.5 election timeouts, is
0.3 s)."""

PRE_VOTE = "--pre-vote=true"
"""etcd's flag for raft's pre-vote, on for every member started here (etcd 3.4 leaves it off): a
member that misses the leader's heartbeats for its election timeout (its host starved of CPU, a
slow fsync) first asks the others whether they would elect it, and they refuse while they still
hear the leader; without it, it campaigns at a higher term and deposes a healthy leader, a
cluster-wide election that short election timeouts (:data:`ELECTION_MS`) make likelier."""


def heartbeat_ms(election_ms: int) -> int:
    """The heartbeat interval of a member whose election timeout is ``election_ms``: a tenth of
    it (etcd's own ratio), at least 1 ms."""
    return max(1, election_ms // 10)


WORK_PREFIX = "hogwild-etcd-"  # then the owner's pid and a dash
START_ATTEMPTS = 3  # starts of etcd tried while each fails only on a port taken meanwhile

INSTALL_HINT = (
    "install it with `apt-get install etcd-server` (Debian/Ubuntu), "
    "or pass --etcd HOST:PORT of a running etcd"
)


def etcd_binary(name: str = "etcd") -> str:
    """The path of the etcd server binary ``name`` (a name on ``PATH`` or a path).

    Raises:
        HogwildError: It is not there, saying how to install it.
    """
    path = shutil.which(name)
    if path is None:
        raise HogwildError(f"etcd binary {name!r} not found: {INSTALL_HINT}")
    return path


def sweep_stale_work(parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove the work directories (``hogwild-etcd-<pid>-*`` in ``parent``, default the
    temporary directory) whose owner is no longer alive: a SIGKILLed job's etcd died with it,
    its data did not. The directories removed."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed = []
    for work in parent.glob(f"{WORK_PREFIX}*-*"):
        owner = work.name.removeprefix(WORK_PREFIX).split("-", 1)[0]
        # a name anyone may make in the shared /tmp: ASCII digits of a pid's length, or not ours
        if not (owner.isascii() and owner.isdigit() and len(owner) <= 10):
            continue
        if process_exists(int(owner)):
            continue
        try:
            if work.is_dir() and work.stat().st_uid == os.getuid():
                shutil.rmtree(work, ignore_errors=True)
                removed.append(work)
        except OSError:
            continue  # gone meanwhile
    return removed


def _start_retrying(
    attempt: Callable[[], str | None], undo: Callable[[], object], deadline: float, what: str
) -> None:
    """Start ``what`` by ``attempt()`` (None: it started; else why not), again while the only
    trouble was a port taken (a probed free port may be taken by another process before etcd
    binds it), at most :data:`START_ATTEMPTS` times and until ``deadline``; ``undo()`` after
    each attempt that failed.

    Raises:
        HogwildError: It did not start, with the last attempt's reason.
    """
    for _ in range(START_ATTEMPTS):
        error = attempt()
        if error is None:
            return
        undo()
        if "address already in use" not in error or time.monotonic() >= deadline:
            break
    raise HogwildError(f"{what} did not start: {error}")


def _work_dir() -> Path:
    """A new work directory named after this process (see :func:`sweep_stale_work`)."""
    sweep_stale_work()
    return Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-"))


_EXEC_SHIM = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(143)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""``python -c _EXEC_SHIM PARENT_PID BINARY ARGS...`` asks Linux to SIGKILL it when its parent
dies (PR_SET_PDEATHSIG = 1, kept across exec; it follows the thread that started it), exits if
the parent already died, then becomes ``BINARY``: the ``preexec_fn`` way is unsafe in a process
with threads (see :data:`hogwild.cluster.roles.SHIM`). SIGKILL is safe for etcd, whose WAL
survives crashes. Run as ``python -I -S``: it needs only the standard library, and without
``site`` (the installed packages' path hooks, which it would import for nothing) each etcd
member's start costs less CPU."""


class EtcdProcess:
    """One etcd server on loopback, for a job or a test; a context manager. With ``tls`` (a
    directory of certificates, :mod:`~hogwild_plugins.ps.etcd_tls`) it serves HTTPS only to
    clients whose certificates its CA signed, and its peers talk TLS too.

    The server listens only on ``host``, keeps its data in ``data_dir`` (default: a temporary
    directory removed by :meth:`stop`) and its stderr in ``etcd.log`` of a temporary directory,
    and dies with this process. Leases of ``lease_floor_s`` seconds must be honoured (checked
    here): etcd's shortest lease is 1.5 election timeouts, so the election
    timeout, ``election_ms`` (:data:`ELECTION_MS` by default; the heartbeat a tenth of it), may
    be at most two thirds of the floor. :attr:`min_ttl_s` is the TTL etcd actually grants when
    asked for 1 s, measured at start.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        host: str = "127.0.0.1",
        binary: str = "etcd",
        lease_floor_s: float = 1.0,
        name: str | None = None,
        tls: str | EtcdTls | None = None,
        election_ms: int = ELECTION_MS,
    ) -> None:
        if not 0.1 <= lease_floor_s <= 60:
            raise HogwildError(f"lease_floor_s={lease_floor_s}: expected 0.1 to 60 seconds")
        if isinstance(election_ms, bool) or not isinstance(election_ms, int) or election_ms < 10:
            raise HogwildError(
                f"etcd election timeout {election_ms!r} ms: expected a whole number of "
                "milliseconds >= 10 (the heartbeat is a tenth of it)"
            )
        if election_ms * 1.5 > lease_floor_s * 1000:
            given = "the default " if election_ms == ELECTION_MS else ""
            raise HogwildError(
                f"lease_floor_s={lease_floor_s:g} needs election_ms <= "
                f"{int(lease_floor_s * 1000 / 1.5)} (got {given}{election_ms}): etcd grants no "
                f"lease shorter than 1.5 election timeouts ({election_ms * 1.5:g} ms)"
            )
        self.election_ms = election_ms
        self.name = name or f"hogwild-{os.getpid()}"
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.host = host
        self.binary = binary
        self.lease_floor_s = lease_floor_s
        self.min_ttl_s = 0
        self.process: subprocess.Popen | None = None
        self._address: str | None = None
        self._work: Path | None = None
        if isinstance(tls, EtcdTls):  # a job-made member's, as installed (its own flags)
            self.tls = tls
        else:
            self.tls = EtcdTls.load(tls, server=True) if tls else None
        self.scheme = "https" if self.tls else "http"

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the client URL."""
        if self._address is None:
            raise HogwildError("etcd is not started")
        return self._address

    @property
    def log_path(self) -> Path | None:
        return self._work / "etcd.log" if self._work else None

    def start(self, timeout_s: float = 20.0) -> str:
        """Start etcd and wait until it grants leases; the ``HOST:PORT`` it serves on.

        Raises:
            HogwildError: No binary, or etcd exited or stayed unready past ``timeout_s`` (with
                the last lines of its log).
        """
        if self.process is not None:
            return self.address
        binary = etcd_binary(self.binary)
        self._work = _work_dir()
        deadline = time.monotonic() + timeout_s
        try:
            _start_retrying(lambda: self._try_start(binary, deadline), self._kill, deadline, "etcd")
            return self.address
        except BaseException:
            self.stop()
            raise

    def _try_start(self, binary: str, deadline: float) -> str | None:
        """Start etcd once; None once it grants a lease, else why not (with its log's tail)."""
        client, peer = self.urls()
        self.launch(binary, client, peer, f"{self.name}={peer}")
        return self.wait_ready(deadline)

    def urls(self) -> tuple[str, str]:
        """A client URL and a peer URL on ports free right now."""
        return tuple(f"{self.scheme}://{host_port(self.host, free_port())}" for _ in range(2))

    def launch(self, binary: str, client: str, peer: str, initial_cluster: str) -> None:
        """Start the etcd process, serving ``client``, talking to its peers on ``peer``, a
        member of ``initial_cluster`` (``NAME=PEER_URL,...``, etcd's flag); no wait."""
        if self._work is None:
            self._work = _work_dir()
        data = self.data_dir or self._work / "data"
        if self.data_dir is None:
            shutil.rmtree(data, ignore_errors=True)  # a failed attempt's half-made member
        election_ms = self.election_ms
        args = [
            f"--name={self.name}",
            f"--data-dir={data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={heartbeat_ms(election_ms)}",
            f"--election-timeout={election_ms}",
            PRE_VOTE,
            "--auto-compaction-mode=revision",  # keep the history of a long job bounded
            "--auto-compaction-retention=10000",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=error",
            *(self.tls.server_args() if self.tls else []),
        ]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _EXEC_SHIM, str(os.getpid()), binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # Ctrl-C goes to the job, which stops etcd itself
            )
        self._address = client.removeprefix(f"{self.scheme}://")

    def wait_ready(self, deadline: float) -> str | None:
        """None once the launched etcd grants a lease, else why not (with its log's tail)."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return f"exit status {self.process.returncode}; {self._log_tail()}"
            granted = self._probe()
            if granted is None:
                time.sleep(0.05)
                continue
            self.min_ttl_s = granted
            if granted > math.ceil(self.lease_floor_s):
                return f"it grants leases of {granted} s, over {self.lease_floor_s} s"
            return None
        return f"not ready after the timeout; {self._log_tail()}"

    def _probe(self) -> int | None:
        """The TTL etcd grants when asked for 1 s, or None while it cannot grant (no leader
        yet, not listening yet). A grant, not ``/health``, because leases are what we need."""
        import requests  # here, not at the top: the roles import this module, few start etcd

        url = f"{self.scheme}://{self._address}/v3"
        secure = self.tls.requests_options() if self.tls else {}
        try:
            with requests.Session() as session:
                reply = session.post(f"{url}/lease/grant", json={"TTL": 1}, timeout=0.5,
                                     **secure).json()  # fmt: skip
                session.post(f"{url}/kv/lease/revoke", json={"ID": reply["ID"]}, timeout=0.5,
                             **secure)  # fmt: skip
            return int(reply["TTL"])
        except (requests.RequestException, ValueError, KeyError, TypeError):
            return None

    def _log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return f"no log at {self.log_path}"
        return f"last lines of {self.log_path}:\n" + "\n".join(text) if text else "its log is empty"

    def _kill(self, grace_s: float = 5.0) -> None:
        process, self.process, self._address = self.process, None, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(grace_s)

    def stop(self) -> None:
        """SIGTERM etcd, SIGKILL it if it lingers, and remove the temporary directory."""
        self._kill()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class EtcdCluster:
    """``size`` etcd members on loopback forming one cluster, for a job; a context manager.

    A majority of the members keeps the cluster serving, so three survive the loss of one. Each
    member is an :class:`EtcdProcess` (its own work directory, dying with this process, its
    election timeout ``election_ms``, :data:`ELECTION_MS` by default); :attr:`address` is their
    client addresses, ``HOST:PORT,HOST:PORT,...``, as :class:`~hogwild_plugins.ps.etcd.Etcd`
    takes them, and
    :attr:`min_ttl_s` the longest of the members' measured shortest leases.
    """

    def __init__(
        self, size: int = 3, *, host: str = "127.0.0.1", binary: str = "etcd",
        lease_floor_s: float = 1.0, tls: str | None = None, election_ms: int = ELECTION_MS,
    ) -> None:  # fmt: skip
        if size < 1:
            raise HogwildError(f"an etcd cluster of {size} members: expected at least one")
        self.members = [
            EtcdProcess(host=host, binary=binary, lease_floor_s=lease_floor_s,
                        name=f"hogwild-{os.getpid()}-{i}", tls=tls, election_ms=election_ms)
            for i in range(size)
        ]  # fmt: skip
        self.binary = binary
        self.min_ttl_s = 0

    @property
    def address(self) -> str:
        """The members' client addresses, ``HOST:PORT,HOST:PORT,...``."""
        return ",".join(member.address for member in self.members)

    def start(self, timeout_s: float = 30.0) -> str:
        """Start every member and wait until each grants leases (the cluster has a leader);
        the members' client addresses.

        Raises:
            HogwildError: No binary, or a member exited or stayed unready past ``timeout_s``
                (naming it, with the last lines of its log); every member is then stopped.
        """
        binary = etcd_binary(self.binary)
        deadline = time.monotonic() + timeout_s
        try:
            _start_retrying(
                lambda: self._try_start(binary, deadline),
                lambda: [member._kill() for member in self.members],
                deadline,
                "the etcd cluster",
            )
            self.min_ttl_s = max(member.min_ttl_s for member in self.members)
            return self.address
        except BaseException:
            self.stop()
            raise

    def _try_start(self, binary: str, deadline: float) -> str | None:
        """Launch every member, then wait for each; None once all grant, else why not."""
        urls = [member.urls() for member in self.members]
        names = [member.name for member in self.members]
        initial = ",".join(f"{name}={peer}" for name, (_, peer) in zip(names, urls, strict=True))
        for member, (client, peer) in zip(self.members, urls, strict=True):
            member.launch(binary, client, peer, initial)
        for member in self.members:
            error = member.wait_ready(deadline)
            if error is not None:
                return f"member {member.name}: {error}"
        return None

    def stop(self) -> None:
        """Stop every member (SIGTERM, SIGKILL if it lingers) and remove its directory."""
        for member in self.members:
            member.stop()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
