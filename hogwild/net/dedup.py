"""Which requests a server has already seen, so that a client's retries are never applied twice.

A client numbers its requests (``Header.sender``, ``Header.seq``) and re-sends one, with the same
number, when its reply does not come in time. The server asks :meth:`RequestWindow.check` about
every request before acting on it:

- ``NEW``: never seen; it is recorded as in progress (:meth:`~RequestWindow.check` does that);
- ``IN_PROGRESS``: seen and not yet answered: drop the copy, the first one's reply will come;
- ``DONE``: answered already: send the recorded reply again instead of applying it twice.

:meth:`~RequestWindow.finish` records the reply (or forgets the request, for an idempotent one such
as a pull, which is simply served again). What a table forgets, and so what a re-send can
find gone (it is then ``NEW``: applied a second time):

- beyond :attr:`~RequestWindow.per_sender` requests of one sender, its oldest (a client keeps at
  most its window, 64, in flight: this forgets nothing a client still waits for);
- beyond :attr:`~RequestWindow.max_senders` senders, the least recently heard sender, whole
  (its requests in progress too): a client whose reply was lost loses its table if that many
  other senders are heard before it re-sends;
- beyond :data:`MAX_ENTRIES` requests in all, answered requests of the senders holding the most,
  oldest first, down to each sender's newest :data:`KEEP` (a client's window): never a request
  in progress, never one of a sender's newest 64. A client re-sending one of its last 64
  requests finds it, however many others send meanwhile. The table may then hold more than
  :data:`MAX_ENTRIES`: those it may not forget (at most ``max_senders`` x 64 answered, 262,144:
  about 80 MiB of acknowledgements, and the requests in progress) and up to a sixteenth of
  :data:`MAX_ENTRIES` more, answered since it last looked.

Without these bounds 4,096 senders of 4,096 requests would keep 16.7 million replies (about
5 GiB). No I/O, no locks: one thread (the server's network thread) owns it. Replication relies
on the same numbers: a client re-sends to a new primary, which drops what it already holds.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from enum import Enum

__all__ = ["KEEP", "MAX_ENTRIES", "RequestWindow", "Seen"]


class Seen(Enum):
    NEW = "new"
    IN_PROGRESS = "in progress"
    DONE = "done"


_PENDING = None
MAX_ENTRIES = 65536
"""Requests a table keeps in all before it forgets answered ones beyond each sender's newest
:data:`KEEP` (an acknowledgement kept costs about 320 bytes: 20 MiB)."""
KEEP = 64
"""A sender's newest requests the bound in entries never forgets: a client's window in flight
(:class:`~hogwild.net.channel.Peers`)."""


class RequestWindow:
    """Recent (sender, seq) pairs and their replies."""

    def __init__(
        self, per_sender: int = 4096, max_senders: int = 4096, max_entries: int = MAX_ENTRIES
    ) -> None:
        self.per_sender, self.max_senders = per_sender, max_senders
        self.max_entries = max_entries
        self._senders: OrderedDict[int, OrderedDict[int, list[bytes] | None]] = OrderedDict()
        self._entries = 0  # requests kept, every sender's
        # past this, answered requests beyond each sender's newest KEEP are forgotten (it is
        # raised above max_entries while kept ones fill the table, so no request scans it all)
        self._limit = max_entries
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
        if self._entries > self._limit:
            self._shrink()
        return Seen.NEW, None

    def _shrink(self) -> None:
        """Forget answered requests of the senders holding the most, oldest first, down to a
        sixteenth below :attr:`max_entries` (so a scan of the senders comes once per that many
        new requests), never one in progress nor one of a sender's newest :data:`KEEP`; when
        those fill the table, look again only once a sixteenth more came."""
        slack = max(1, self.max_entries // 16)
        excess = self._entries - (self.max_entries - slack)
        sizes = [len(seen) for seen in self._senders.values() if len(seen) > KEEP]
        if excess > 0 and sizes:
            # the highest level whose cut forgets enough (every sender above it cut to it)
            low, high = KEEP, max(sizes)
            while low < high:
                level = (low + high + 1) // 2
                if sum(size - level for size in sizes if size > level) >= excess:
                    low = level
                else:
                    high = level - 1
            for seen in self._senders.values():
                if len(seen) > low:
                    self._forget_oldest(seen, len(seen) - low)
        self._limit = max(self.max_entries, self._entries + slack)

    def _forget_oldest(self, seen: OrderedDict, count: int) -> None:
        """Forget up to ``count`` of ``seen``'s answered requests, oldest first, none of its
        newest :data:`KEEP`."""
        gone = []
        for seq, reply in itertools.islice(seen.items(), len(seen) - KEEP):
            if reply is not _PENDING:
                gone.append(seq)
                if len(gone) == count:
                    break
        for seq in gone:
            del seen[seq]
        self._entries -= len(gone)

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
