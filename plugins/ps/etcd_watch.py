"""The etcd watch: threads calling ``on_change()`` when keys under a prefix change.

:meth:`Etcd.watch <hogwild_plugins.ps.etcd.Etcd.watch>` returns a :class:`Watch`. It hears etcd's
own watch stream (:mod:`~hogwild_plugins.ps.etcd_stream`) and polls one small range request as its
safety net and liveness check (:mod:`~hogwild_plugins.ps.etcd_poll`), every
:data:`SAFETY_POLL_S` while a stream is up and every ``interval_s`` (50 ms) while none is. The
invariant it keeps: every net change under the prefix made after the first reading is reported by
an ``on_change()`` call from the one polling thread, after a poll that read it. The client
(:class:`~hogwild_plugins.ps.etcd.Etcd`) is the caller's; the watch owns a reader of its own,
its polls' connections and its stream, and closes them on every exit path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from hogwild_plugins.ps.etcd_errors import EtcdUnavailable, reply_int
from hogwild_plugins.ps.etcd_keys import b64 as _b64
from hogwild_plugins.ps.etcd_poll import RangePoller
from hogwild_plugins.ps.etcd_stream import WatchStream
from hogwild_plugins.ps.etcd_tls import EtcdTls

from hogwild.errors import HogwildError

if TYPE_CHECKING:
    from hogwild_plugins.ps.etcd import Etcd

__all__ = ["POLL_REQUESTS", "SAFETY_POLL_S", "Watch"]

NO_READING = (-1, -1)  # the signature of a first reading that failed: any reading differs

log = logging.getLogger(__name__)

POLL_REQUESTS = 5  # the most requests one poll makes of a member (Watch.cancel)
SAFETY_POLL_S = 0.5
"""How often a watch whose stream is up polls all the same (:class:`Watch`): ten times fewer polls
than the 50 ms it polls at while no stream is up. A member that answers sees a net change within
this even when its stream died silently. A member that holds the poll without answering (on a cut
host, or stopped) is left for the next member only after the request timeout (``timeout_s``, 2 s),
its stream hanging too: a change is then seen up to this plus a timeout per such member late."""


class Watch:
    """Threads calling ``on_change()`` when keys under a prefix change; :meth:`cancel` ends them.

    etcd's own watch says so at once: a stream
    (:class:`~hogwild_plugins.ps.etcd_stream.WatchStream`, ``POST /v3/watch`` on a kept connection
    of its own, from the revision after the first reading, so nothing made in between is missed), on
    whose every event the polling thread polls at once and calls ``on_change()`` (the poll first, so
    that the reading it keeps is never older than the state reported).

    The polls stay, as the safety net and the liveness check: one range request that returns the
    number of keys under the prefix and the newest mod_revision among them (``keys_only``,
    ``limit=1``, sorted by mod_revision): any write that survives raises the newest mod_revision
    (revisions only grow), and a change made only of deletions lowers the count, so every net change
    is seen; a key written and deleted again between two polls is not. They run every
    ``slow_interval_s`` while a stream is up (:data:`SAFETY_POLL_S`: within that a change is seen
    even if the stream died silently, on a member that still answers; a member that holds the
    poll, as one on a cut host does, costs a request timeout before the next is asked, see
    :data:`SAFETY_POLL_S`) and every ``interval_s`` while none is (today's 50 ms). A change a
    poll sees while the stream is up, and that the stream has still not reported one poll
    later, means its flow died silently (a NAT that forgot it, a lost FIN): it is opened again,
    and logged once at WARNING; TCP keepalive on its socket finds a dead peer within about 25 s
    even with no change. A stream that ends, errs or says something etcd
    does not is opened again, with a back-off, on the member the polls reach (the polls moving to
    another member, or failing, move it too), and once created it calls ``on_change()`` (changes may
    have been missed). The polls go over plain HTTP (or HTTPS, with the client's certificate) on a
    kept connection of the watch's own (:mod:`hogwild_plugins.ps.etcd_poll`), as does the stream;
    etcd3gw's streaming watch is not used (no timeout, chunks parsed as whole messages, errors lost
    in a thread).

    A failed poll goes to ``on_error(exc)`` (or the log) once per outage, and polling goes on more
    slowly; once etcd answers again ``on_change()`` is called, since changes may have been missed. A
    malformed stream message goes there too (once until a stream is created again), handed over to
    the polling thread. An exception from ``on_change`` is reported the same way and does not stop
    it. ``on_change()`` and ``on_error()`` are only called from the polling thread, one call at a
    time, and the polls are ``interval_s`` apart at least
    (a burst of events costs no more polls than polling alone did).
    """

    def __init__(
        self, reader: Etcd, start: bytes, end: bytes, on_change, interval_s, revision, on_error,
        slow_interval_s: float = SAFETY_POLL_S,
        near_return: tuple[float, float, int] = (5.0, 0.5, 12),
    ) -> None:  # fmt: skip
        if not (interval_s > 0 and slow_interval_s > 0):
            raise HogwildError(
                f"etcd watch intervals {interval_s!r} s and {slow_interval_s!r} s: expected more "
                "than 0"
            )
        self._reader = reader
        self._range = {"key": _b64(start), "range_end": _b64(end), "keys_only": True}
        self._range |= {"limit": 1, "sort_order": "DESCEND", "sort_target": "MOD"}
        self._on_change = on_change
        self._on_error = on_error
        self._interval_s, self._slow_s = interval_s, max(interval_s, slow_interval_s)
        self._stop = threading.Event()
        self._wake = threading.Event()  # news for the polling thread: see _poll
        self._heard_count = 0  # the stream's reports so far (changes, or a stream created again)
        self._errors: queue.SimpleQueue = queue.SimpleQueue()  # the stream's, reported by _poll
        self._poller = None  # the polls' own transport, once the first reading is taken
        self._stream = None
        # The first reading is taken here, before watch() returns, so that every change made
        # after it returns is seen (a first poll in the thread could come after the change).
        try:
            seen, read_at = self._signature(revision)
            after = read_at if revision is None else revision  # the stream's changes: after it
        except EtcdUnavailable:
            reader.close()
            raise
        except HogwildError:
            seen, after = NO_READING, None  # the revision is compacted or in the future: a change
        # the polls after it: on kept connections of their own, over HTTPS where the client's
        # are (a quarter of the CPU a poll costs through etcd3gw: etcd_poll,
        # bench/figures/etcd_poll.py)
        clients = reader._clients  # etcd3gw's, each its member's API path once asked
        try:  # the reader closed on any error (a TLS directory gone, a bad key), not only etcd's
            context = EtcdTls.load(reader.tls).ssl_context() if reader.tls else None
            self._poller = poller = RangePoller(  # from the member the first reading reached
                reader.members, lambda i: clients[i].api_path, reader.timeout_s, reader._current,
                tls=context, near=reader._near, near_return=near_return,
            )  # fmt: skip
            self._stream = WatchStream(
                reader.members, lambda i: clients[i].api_path, reader.timeout_s, start,
                end, None if after is None else after + 1, lambda: poller.current,
                self._heard, self._stream_error, tls=context, on_down=self._wake.set,
            )  # fmt: skip
            self._thread = threading.Thread(
                target=self._run, args=(seen,), name="hogwild-etcd-watch", daemon=True
            )
            self._stream.start()
            self._thread.start()
        except BaseException:
            if self._stream is not None:
                self._stream.close()
            if self._poller is not None:
                self._poller.close()
            reader.close()
            raise

    def cancel(self) -> None:
        """Stop the polls and the stream; returns once both threads have ended (from
        ``on_change``, at once: the polling thread ends and closes the stream when it returns),
        and within the longest a poll can take, then the stream's join: per member, the API
        path's request, the poll, its one retry on a fresh connection, and after ``leader
        changed`` the poll asked again with its own retry (:data:`POLL_REQUESTS`, five requests,
        each up to the request timeout), plus ``interval_s`` and a second; then the stream's
        thread, whose socket is shut down at once (ending its read) but which may be opening a
        stream, whose API path request cannot be cut
        (:data:`~hogwild_plugins.ps.etcd_stream.STREAM_REQUESTS` request timeouts
        and a second). A poll that ends after this began reports no change (the flag is checked
        just before ``on_change()``), so once the thread has ended within that bound,
        ``on_change()`` is not called again; only a callback itself slower than the bound can
        outlive it."""
        self._stop.set()
        self._wake.set()
        self._stream.stop()  # its socket shut down now: it ends while the polls do
        if threading.current_thread() is not self._thread:
            polls = POLL_REQUESTS * len(self._reader.members) * self._reader.timeout_s
            self._thread.join(polls + self._interval_s + 1.0)
            self._stream.close()
        # else: from on_change(), which must not wait: the polling thread ends when it returns,
        # and closes the stream (joins its thread) then, on its way out (_run)
        self._reader.close()  # it has no watches of its own: its connections closed

    @property
    def active(self) -> bool:
        return self._thread.is_alive() or self._stream.active

    @property
    def streaming(self) -> bool:
        """Whether a stream is up now (the polls then run every ``slow_interval_s``)."""
        return self._stream.up

    def _heard(self) -> None:
        """The stream's news (a change, or a stream opened again): poll and report it now."""
        self._heard_count += 1  # only the stream's thread writes it
        self._wake.set()

    def _stream_error(self, err: Exception) -> None:
        """The stream's error, handed to the polling thread: ``on_error`` is called from it only."""
        self._errors.put(err)
        self._wake.set()

    def _signature(self, revision: int | None = None) -> tuple[tuple[int, int], int]:
        """The prefix's (key count, newest mod_revision), and the revision it was read at."""
        if revision is None and self._poller is not None:  # none before the first reading
            reply = self._poller.post("/kv/range", self._range)
        else:
            query = self._range if revision is None else {**self._range, "revision": revision}
            reply = self._reader._post("/kv/range", query)
        address = self._reader.address
        read_at = reply_int(reply.get("header"), "revision", address)  # a range reply, not another
        kvs = self._reader._kvs(reply) or [{}]
        newest = reply_int(kvs[0], "mod_revision", address, default=0)
        return (reply_int(reply, "count", address, default=0), newest), read_at

    def _run(self, seen: tuple[int, int]) -> None:
        try:
            self._poll(seen)
        finally:  # the thread's own connections, and the stream's thread, however it ends
            self._stream.close()
            if self._poller is not None:
                self._poller.close()

    def _poll(self, seen: tuple[int, int]) -> None:
        failing, reports = False, 0
        unheard: int | None = None  # the stream's report count when a poll saw a change it missed
        warned = False
        while not self._stop.is_set():
            self._wake.clear()  # cleared before the poll: news after it wakes us again
            count = self._heard_count  # read once: an event landing now counts next time
            heard, reports = count != reports, count
            while not self._errors.empty():
                self._report(self._errors.get())
            polled = time.monotonic()
            try:
                now, _ = self._signature()
            except Exception as err:  # noqa: BLE001 - etcd down, or a reply that makes no sense
                if not failing:
                    self._report(err)
                    self._stream.restart()  # one on a member that stopped answering may hang
                failing = True
                self._wake.wait(max(self._interval_s, 0.5))
                continue
            if self._stream.on not in (None, self._poller.current):
                self._stream.restart()  # the polls moved to another member: the stream follows
            elif unheard is not None and unheard == self._heard_count and self._stream.up:
                # a change the stream, up all along, has not reported a whole poll later: its
                # flow died silently (a NAT forgot it, a FIN lost) while the polls' one lives
                (log.debug if warned else log.warning)(
                    "etcd watch of %s: the stream at %s missed a change: opened again",
                    self._range["key"], self._poller.members[self._stream.on],
                )  # fmt: skip
                warned = True
                self._stream.restart()
            unheard = None
            if now != seen and not heard and self._stream.up and seen != NO_READING:
                # the count before the poll: an event that came during it counts as heard (and
                # after no real reading, the stream's first report was its creation's, not due)
                unheard = reports  # it may be in flight still: the next poll decides
            if self._stop.is_set():  # cancelled during the poll: cancel() may have returned
                break
            if now != seen or failing or heard:
                try:
                    self._on_change()
                except Exception as err:  # noqa: BLE001 - the callback's bug must not end us
                    self._report(err)
            seen, failing = now, False
            self._wake.wait(self._slow_s if self._stream.up else self._interval_s)
            rest = self._interval_s - (time.monotonic() - polled)
            if rest > 0:  # a burst of news: a poll per interval_s at most, never more than before
                self._stop.wait(rest)

    def _report(self, err: Exception) -> None:
        if self._on_error is None:
            log.warning("etcd watch of %s: %s", self._range["key"], err)
            return
        try:
            self._on_error(err)
        except Exception:  # noqa: BLE001
            log.exception("etcd watch: on_error failed")
