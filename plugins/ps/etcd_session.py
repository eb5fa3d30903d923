"""The etcd client's ``requests`` sessions: etcd reached directly, and closed mid-request.

:class:`~hogwild_plugins.ps.etcd.Etcd` talks to each member through a ``requests`` session of
its own (etcd3gw's client holds it). Two things differ from a plain session:

- the environment's proxies and CA bundles are ignored (``trust_env`` off): etcd is never
  reached through a proxy, and over TLS its members are checked against the job's CA alone;
- closing it cuts the connections lent to requests in flight, not only the idle ones. A hedged
  request (:meth:`~hogwild_plugins.ps.etcd.Etcd._hedged`) leaves asks open on members that
  did not answer (one on a cut host holds a read for the whole request timeout); the client's
  ``close()`` abandons them, and cutting their connections (the socket shut down under the
  thread reading it) ends them at once, instead of a thread and a socket kept for up to the
  timeout after the client is gone. ``requests``' own close empties the pools but leaves a
  connection in use to be closed whenever its request returns.
"""

from __future__ import annotations

import socket
import threading
import weakref

import requests
from requests.adapters import HTTPAdapter

__all__ = ["direct_session"]


def direct_session(session: requests.Session | None = None) -> requests.Session:
    """``session`` (a new one if None) made direct (no proxy, no environment's CA bundle) and
    closable mid-request (see the module docstring): its HTTP and HTTPS adapters replaced."""
    session = session if session is not None else requests.Session()
    session.trust_env = False
    adapter = _CuttingAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class Lent:
    """The connections a session's pools lent out and not yet got back, safe across threads:
    requests in flight on other threads (a hedged request's asks) take and give back
    connections while :meth:`snapshot` is read by the thread closing the session. Weakly held:
    a connection its pool dropped instead of getting it back (its request failed) is
    forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a WeakSet iterated while another thread adds fails
        self._connections: weakref.WeakSet = weakref.WeakSet()

    def add(self, connection) -> None:
        with self._lock:
            self._connections.add(connection)

    def discard(self, connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def snapshot(self) -> list:
        """The connections lent out now (a copy: the set may change as soon as it returns)."""
        with self._lock:
            return list(self._connections)


class _CuttingAdapter(HTTPAdapter):
    """An adapter whose pools note the connections they lend out, which :meth:`close` cuts."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self._lent = Lent()
        manager = self.poolmanager
        manager.pool_classes_by_scheme = {
            scheme: _lending(pool, self._lent)
            for scheme, pool in manager.pool_classes_by_scheme.items()
        }

    def close(self) -> None:
        for connection in self._lent.snapshot():
            _cut(connection)
        super().close()


def _lending(pool_class: type, lent: Lent) -> type:
    """``pool_class`` noting in ``lent`` each connection from when it is taken for a request
    until it is given back."""

    class Lending(pool_class):
        def _get_conn(self, timeout=None):
            connection = super()._get_conn(timeout)
            lent.add(connection)
            return connection

        def _put_conn(self, connection) -> None:
            if connection is not None:
                lent.discard(connection)
            super()._put_conn(connection)

    Lending.__name__ = Lending.__qualname__ = f"Lending{pool_class.__name__}"
    return Lending


def _cut(connection) -> None:
    """Shut ``connection``'s socket down, both ways: a thread blocked reading it reads the end
    at once (its request fails). The plain socket's shutdown, not TLS's: the TLS object stays
    whole for the thread reading it, which only sees the connection closed."""
    sock = getattr(connection, "sock", None)
    if sock is None:  # not connected yet, or closed already: its connect has its own timeout
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # closed meanwhile, or never connected
        pass
