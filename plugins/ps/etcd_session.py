"""The etcd client's ``requests`` sessions: etcd reached directly, and asks cut mid-request.

:class:`~hogwild_plugins.ps.etcd.Etcd` talks to each member through a ``requests`` session of
its own (etcd3gw's client holds it). Two things differ from a plain session:

- the environment's proxies and CA bundles are ignored (``trust_env`` off): etcd is never
  reached through a proxy, and over TLS its members are checked against the job's CA alone;
- its pools note which thread each connection is lent to, so that :func:`cut_asks` can cut the
  connections of given threads mid-request. A hedged request
  (:meth:`~hogwild_plugins.ps.etcd.Etcd._hedged`) leaves asks open on members that did not
  answer, each in a thread of its own (one on a cut host holds a read for the whole request
  timeout); the client's ``close()`` abandons them, and cutting their connections (the socket
  shut down under the thread reading it) ends their reads at once, instead of a thread and a
  socket kept for up to the timeout after the client is gone. Only those: a request another
  thread has in flight on the client (not abandoned, its caller waiting for it) is left to
  finish, as ``requests``' own close leaves a connection in use to be closed when its request
  returns. An abandoned ask still connecting (no socket yet) is not cut: its connect ends with
  its own timeout; nor is one that had not yet taken a connection when the client closed.
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections.abc import Iterable

import requests
from requests.adapters import HTTPAdapter

__all__ = ["cut_asks", "direct_session"]


def direct_session(session: requests.Session | None = None) -> requests.Session:
    """``session`` (a new one if None) made direct (no proxy, no environment's CA bundle) and
    its asks cuttable mid-request (:func:`cut_asks`): its HTTP and HTTPS adapters replaced."""
    session = session if session is not None else requests.Session()
    session.trust_env = False
    adapter = _CuttingAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def cut_asks(session: requests.Session, threads: Iterable[threading.Thread]) -> None:
    """Cut the connections ``session`` (made by :func:`direct_session`) has lent to requests
    in flight on ``threads``, so that each thread's read fails at once (see the module
    docstring); other threads' requests are left alone."""
    wanted = set(threads)
    adapters = {id(adapter): adapter for adapter in session.adapters.values()}  # one, mounted twice
    for adapter in adapters.values():
        if isinstance(adapter, _CuttingAdapter):
            adapter.lent.cut(wanted)


class Lent:
    """The connections a session's pools lent out and not yet got back, each with the thread
    that took it, safe across threads: requests in flight on other threads (a hedged request's
    asks) take and give back connections while :meth:`cut` is run by the thread closing
    the client. Weakly held: a connection its pool dropped instead of getting it back (its
    request failed) is forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a weak dict iterated while another thread adds fails
        self._takers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def add(self, connection: object) -> None:
        with self._lock:
            self._takers[connection] = threading.current_thread()

    def discard(self, connection: object) -> None:
        with self._lock:
            self._takers.pop(connection, None)

    def cut(self, threads: set[threading.Thread]) -> None:
        """Cut (:func:`_cut`) the connections lent now to any of ``threads``, under the lock: a
        connection given back meanwhile (discarded before it is pooled) and lent to another
        thread cannot be cut by mistake. A shutdown does not block."""
        with self._lock:
            for connection, thread in list(self._takers.items()):
                if thread in threads:
                    _cut(connection)


class _CuttingAdapter(HTTPAdapter):
    """An adapter whose pools note the connections they lend out and to which thread
    (:attr:`lent`), for :func:`cut_asks`."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.lent = Lent()
        manager = self.poolmanager
        manager.pool_classes_by_scheme = {
            scheme: _lending(pool, self.lent)
            for scheme, pool in manager.pool_classes_by_scheme.items()
        }


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
