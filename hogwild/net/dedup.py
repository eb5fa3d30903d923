"""Which requests a server has already seen, so that a client's retries are never applied twice.

A client numbers its requests (``Header.sender``, ``Header.seq``) and re-sends one, with the same
number, when its reply does not come in time. The server asks :meth:`RequestWindow.check` about
every request before acting on it:

- ``NEW``: never seen; it is recorded as in progress (:meth:`~RequestWindow.check` does that);
- ``IN_PROGRESS``: seen and not yet answered: drop the copy, the first one's reply will come;
- ``DONE``: answered already: send the recorded reply again instead of applying it twice.

:meth:`~RequestWindow.finish` records the reply (or forgets the request, for an idempotent one such
as a pull, which is simply served again). Each sender keeps its last :attr:`per_sender` requests;
senders beyond :attr:`max_senders` are forgotten oldest first, and beyond :data:`MAX_ENTRIES`
requests in all the least recently heard sender's oldest go first (4,096 senders of 4,096 would
otherwise keep 16.7 million replies, about 5 GiB of acknowledgements; a client still sending
keeps its requests in flight). No I/O, no locks: one thread (the
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
MAX_ENTRIES = 65536
"""Requests a table keeps in all (an acknowledgement kept costs about 320 bytes: 20 MiB; 64
in flight for each of 1,024 clients at once)."""


class RequestWindow:
    """Recent (sender, seq) pairs and their replies."""

    def __init__(
        self, per_sender: int = 4096, max_senders: int = 4096, max_entries: int = MAX_ENTRIES
    ) -> None:
        self.per_sender, self.max_senders = per_sender, max_senders
        self.max_entries = max_entries
        self._senders: OrderedDict[int, OrderedDict[int, list[bytes] | None]] = OrderedDict()
        self._entries = 0  # requests kept, every sender's
        self.duplicates = 0

    def check(self, sender: int, seq: int) -> tuple[Seen, list[bytes] | None]:
        """What to do with request ``seq`` of ``sender`` (a ``NEW`` one is now in progress)."""
        seen = self._senders.get(sender)
        if seen is None:
            seen = self._senders[sender] = OrderedDict()
            if len(self._senders) > self.max_senders:
                self._entries -= len(self._senders.popitem(last=False)[1])
        else:
            self._senders.move_to_end(sender)
            if seq in seen:
                self.duplicates += 1
                reply = seen[seq]
                return (Seen.IN_PROGRESS, None) if reply is _PENDING else (Seen.DONE, reply)
        seen[seq] = _PENDING
        self._entries += 1
        if len(seen) > self.per_sender:
            seen.popitem(last=False)
            self._entries -= 1
        while self._entries > self.max_entries:  # the least recently heard sender's oldest
            oldest = next(iter(self._senders.values()))
            oldest.popitem(last=False)
            self._entries -= 1
            if not oldest:
                self._senders.popitem(last=False)
        return Seen.NEW, None

    def finish(self, sender: int, seq: int, reply: list[bytes] | None) -> None:
        """Request ``seq`` was answered with ``reply`` (its frames), or None to forget it."""
        seen = self._senders.get(sender)
        if seen is None or seq not in seen:
            return
        if reply is None:
            del seen[seq]
            self._entries -= 1
        else:
            seen[seq] = list(reply)

    def __len__(self) -> int:
        return self._entries
