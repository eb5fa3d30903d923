"""Which requests a server has already seen, so that a client's retries are never applied twice.

A client numbers its requests (``Header.sender``, ``Header.seq``) and re-sends one, with the same
number, when its reply does not come in time. The server asks :meth:`RequestWindow.check` about
every request before acting on it:

- ``NEW``: never seen; it is recorded as in progress (:meth:`~RequestWindow.check` does that);
- ``IN_PROGRESS``: seen and not yet answered: drop the copy, the first one's reply will come;
- ``DONE``: answered already: send the recorded reply again instead of applying it twice.

:meth:`~RequestWindow.finish` records the reply (or forgets the request, for an idempotent one such
as a pull, which is simply served again). Each sender keeps its last :attr:`per_sender` requests;
senders beyond :attr:`max_senders` are forgotten oldest first. No I/O, no locks: one thread (the
server's network thread) owns it. Replication relies on the same numbers: a client re-sends to
a new primary, which drops what it already holds.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum

__all__ = ["RequestWindow", "Seen"]


class Seen(Enum):
    NEW = "new"
    IN_PROGRESS = "in progress"
    DONE = "done"


_PENDING = None


class RequestWindow:
    """Recent (sender, seq) pairs and their replies."""

    def __init__(self, per_sender: int = 4096, max_senders: int = 4096) -> None:
        self.per_sender, self.max_senders = per_sender, max_senders
        self._senders: OrderedDict[int, OrderedDict[int, list[bytes] | None]] = OrderedDict()
        self.duplicates = 0

    def check(self, sender: int, seq: int) -> tuple[Seen, list[bytes] | None]:
        """What to do with request ``seq`` of ``sender`` (a ``NEW`` one is now in progress)."""
        seen = self._senders.get(sender)
        if seen is None:
            seen = self._senders[sender] = OrderedDict()
            if len(self._senders) > self.max_senders:
                self._senders.popitem(last=False)
        else:
            self._senders.move_to_end(sender)
            if seq in seen:
                self.duplicates += 1
                reply = seen[seq]
                return (Seen.IN_PROGRESS, None) if reply is _PENDING else (Seen.DONE, reply)
        seen[seq] = _PENDING
        if len(seen) > self.per_sender:
            seen.popitem(last=False)
        return Seen.NEW, None

    def finish(self, sender: int, seq: int, reply: list[bytes] | None) -> None:
        """Request ``seq`` was answered with ``reply`` (its frames), or None to forget it."""
        seen = self._senders.get(sender)
        if seen is None or seq not in seen:
            return
        if reply is None:
            del seen[seq]
        else:
            seen[seq] = list(reply)

    def __len__(self) -> int:
        return sum(len(s) for s in self._senders.values())
