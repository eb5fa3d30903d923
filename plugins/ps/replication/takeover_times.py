"""When this server's last takeovers happened: the record ``hogwild ps status`` shows as
``takeovers`` and the fault bench's failover figures are taken from (``bench/support/ps_watch``).

A takeover is a campaign won over another primary (not a bucket's first one). Each record holds
its bucket and epoch and three wall-clock times: ``won_at`` (the campaign's record written),
``serving_at`` (its copies caught up: the role serves) and ``first_ack_at`` (the first update of
the bucket acknowledged: the end of the failover). The replication thread writes them; the
status reads a copy. Only the last :data:`MAX_TAKEOVERS` are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MAX_TAKEOVERS", "TakeoverTimes"]

MAX_TAKEOVERS = 64


class TakeoverTimes:
    """The last takeovers' records, and the ones still waiting for their first acknowledgement."""

    def __init__(self) -> None:
        self.records: list[dict] = []  # the last takeovers, oldest first
        self._awaiting_ack: dict[int, dict] = {}  # by bucket: a record whose failover goes on

    def won(self, bucket: int, epoch: int) -> None:
        """A campaign won over another primary wrote ``bucket``'s record of ``epoch``."""
        self.records.append(
            {
                "bucket": bucket,
                "epoch": epoch,
                "won_at": time.time(),
                "serving_at": None,  # its copies caught up (:meth:`note_serving`)
                "first_ack_at": None,
            }
        )
        del self.records[:-MAX_TAKEOVERS]
        self._awaiting_ack[bucket] = self.records[-1]

    def note_serving(self, serving: Callable[[int], bool]) -> None:
        """After a turn of the bucket roles: stamp each awaiting takeover whose role
        ``serving(bucket)`` says serves now (its copies caught up)."""
        for bucket, entry in self._awaiting_ack.items():  # (empty but after a takeover)
            if entry["serving_at"] is None and serving(bucket):
                entry["serving_at"] = time.time()

    def acknowledged(self, bucket: int) -> None:
        """An update of ``bucket`` was acknowledged: the end of its failover, if it is the
        first after a takeover."""
        entry = self._awaiting_ack.pop(bucket, None)
        if entry is not None:
            entry["first_ack_at"] = time.time()
            if entry["serving_at"] is None:  # it served before a turn of the roles saw it
                entry["serving_at"] = entry["first_ack_at"]

    @property
    def awaiting_ack(self) -> bool:
        """A takeover's failover has not ended yet (cheap: asked at every acknowledgement)."""
        return bool(self._awaiting_ack)
