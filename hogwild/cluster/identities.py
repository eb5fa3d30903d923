"""The job's roster as the driver keeps it: every role's public key and address, public only.

A job whose roles listen beyond loopback gives each role a CURVE key pair of its own
(:mod:`hogwild.net.auth`): the launcher has the role's key pair made where the role will run
(the local launcher in the driver's private directory, the Ray launcher by the role's actor on
its node) and hands the driver only the public key, which :class:`JobKeys` writes into the
roster, ``RUN_DIR/keys/roster.json``, with the role's address once it is known (a parameter
server's before it starts, the others' from their ready lines). Servers read the roster as their
allow-list (again whenever it changes: roles join while the job runs), clients find a server's
public key at its address there. Where roles cannot see the driver's run directory (another
node), ``publish`` carries each new roster to them.

The driver has key pairs of its own in ``RUN_DIR/private-keys`` (mode 0700): ``driver`` (its
clients of the servers and replicas, its status server) and ``user`` (for ``hogwild cluster
status`` and other tools run by the job's user on the driver's node: ``HOGWILD_KEY`` set to
``RUN_DIR/private-keys/user.key_secret``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from hogwild.cluster.roles import RoleSpec, planned_address
from hogwild.net.auth import has_roster, make_identity, read_roster, use_identity, write_roster

__all__ = ["PRIVATE", "JobKeys"]

PRIVATE = "private-keys"


class JobKeys:
    """The roster of one job (see the module docstring).

    Args:
        keys: The job's key directory (public: the roster).
        private: The driver's own directory of secret keys (its roles' too, with the local
            launcher).
    """

    def __init__(self, keys: Path, private: Path) -> None:
        self.keys, self.private = Path(keys), Path(private)
        self.roles: dict[str, dict] = read_roster(self.keys) if has_roster(self.keys) else {}
        self.publish: Callable[[bytes], None] | None = None  # set by a launcher with far roles
        self._lock = threading.Lock()

    @classmethod
    def make(cls, run_dir: Path) -> JobKeys:
        """The run directory's roster (a resumed job's is kept), with the driver's key pairs;
        this process speaks as ``driver`` from now on."""
        job = cls(run_dir / "keys", run_dir / PRIVATE)
        for own in ("driver", "user"):
            path, public = make_identity(job.private, own)
            job.add(own, public)
            if own == "driver":
                use_identity(path)
        return job

    def add(self, role: str, public: str, address: str = "") -> None:
        """``role``'s public key (and its address, if known before it starts)."""
        with self._lock:
            old = self.roles.get(role, {})
            entry = {"key": public, "address": address or old.get("address", "")}
            if entry != old:  # a restarted role with the same key pair changes nothing
                self.roles[role] = entry
                self._write()

    def enter(self, spec: RoleSpec, public: str) -> None:
        """The role ``spec`` starts with the key pair whose public key is ``public``: into the
        roster, with the address it will serve on where that is fixed before it starts (a
        parameter server's; the others' come with their ready lines, :meth:`located`)."""
        self.add(spec.name, public, planned_address(spec))

    def located(self, role: str, address: str) -> None:
        """``role`` serves at ``address`` (its ready line)."""
        with self._lock:
            if role in self.roles and self.roles[role]["address"] != address:
                self.roles[role]["address"] = address
                self._write()

    def identity_for(self, role: str) -> tuple[Path, str]:
        """A key pair for ``role`` made here, in the driver's private directory (a role the
        local launcher runs on this node); its secret file and public key."""
        return make_identity(self.private, role)

    def _write(self) -> None:
        path = write_roster(self.keys, self.roles)
        if self.publish is not None:
            self.publish(path.read_bytes())
