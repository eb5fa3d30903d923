"""Batched LMDB record reads from numba, through liblmdb's C API: one call per batch, not per key.

The Python binding costs about a microsecond of interpreter work per ``get``, more than an
in-memory gather of a small image takes. This module opens the cache a second way -- straight
through the C library that the ``lmdb`` package already loaded -- and runs the whole batch in one
``nogil`` numba kernel: build the big-endian key, ``mdb_get``, check the record's 16-byte header
prefix, copy the label and the pixels into the caller's rows.

The kernel also remembers every record's address in a per-process table. LMDB guarantees that a
value returned inside a read-only transaction stays valid, at the same address, until that
transaction ends, and a cache is immutable once its ingest finished, so from the second read of a
record on, a read is a plain ``memcpy`` from the memory map: the same work as a numpy gather.

Invariant: addresses are used only in the process and under the transaction that produced them;
the owner (:class:`hogwild.data.cache.ImageCache`) refuses use after fork and drops the table when
it closes the environment. The environment is opened read-only, without the lock file
(``MDB_NOLOCK``: nobody writes a finished cache) and with ``MDB_NOTLS`` (the prefetch thread reads
with the transaction its worker opened).

:data:`AVAILABLE` is False when no loaded library exports the C API (a build of the ``lmdb``
package that hides its symbols); the cache then reads through the Python binding instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

import numpy as np
from numba import njit, types

MDB_RDONLY = 0x20000
MDB_NOTLS = 0x200000
MDB_NOLOCK = 0x400000
MDB_NORDAHEAD = 0x800000

STATUS_OK = 0
STATUS_NOT_FOUND = 1
STATUS_BAD_SIZE = 2
STATUS_BAD_HEADER = 3
STATUS_MDB_ERROR = 4
STATUS_OUT_OF_RANGE = 5

_MDB_NOTFOUND = -30798
_FUNCTIONS = (
    "env_create",
    "env_set_maxdbs",
    "env_open",
    "env_close",
    "txn_begin",
    "txn_abort",
    "dbi_open",
    "get",
    "strerror",
)


def _candidate_libraries():
    """The Python binding's own library first, then the system's liblmdb.

    A generator: the system's library is looked for only when the binding's does not export the
    C API, because ``ctypes.util.find_library`` runs ``ldconfig`` and, when that does not list the
    library, a C compiler and the linker: start-up work in every process that imports this
    module, wasted when the binding's library has the API.
    """
    try:
        import lmdb.cpython as binding

        yield binding.__file__
    except ImportError:  # the package runs on its cffi backend
        pass
    system = ctypes.util.find_library("lmdb")
    if system:
        yield system


def _load_api():
    """(library, symbol prefix) of the first library exporting the whole C API, or None."""
    for path in _candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("mdb09_", "mdb_"):
            if all(hasattr(lib, prefix + name) for name in _FUNCTIONS):
                return lib, prefix
    return None


def _bind():
    """Declare the C functions for ctypes and expose mdb_get and memcpy to numba's JIT."""
    found = _load_api()
    if found is None:
        return None
    lib, prefix = found
    import llvmlite.binding as llvm

    p, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
    api = {}
    for name, restype, argtypes in (
        ("env_create", i, [ctypes.POINTER(p)]),
        ("env_set_maxdbs", i, [p, u]),
        ("env_open", i, [p, ctypes.c_char_p, u, u]),
        ("env_close", None, [p]),
        ("txn_begin", i, [p, p, u, ctypes.POINTER(p)]),
        ("txn_abort", None, [p]),
        ("dbi_open", i, [p, ctypes.c_char_p, u, ctypes.POINTER(u)]),
        ("strerror", ctypes.c_char_p, [i]),
    ):
        function = getattr(lib, prefix + name)
        function.restype, function.argtypes = restype, argtypes
        api[name] = function
    libc = ctypes.CDLL(None)
    # Fixed names for the JIT, whatever the library calls them: a cached kernel links by name.
    llvm.add_symbol("hogwild_mdb_get", ctypes.cast(getattr(lib, prefix + "get"), p).value)
    llvm.add_symbol("hogwild_memcpy", ctypes.cast(libc.memcpy, p).value)
    return api


_API = _bind()
AVAILABLE = _API is not None
"""Whether batched reads through the C API are possible in this process."""


class NativeEnv:
    """A read-only LMDB environment opened through the C API, with one open read transaction.

    Args:
        path: The cache directory (holding ``data.mdb``).
        db_name: The named database holding the records.
        max_dbs: How many named databases the environment may hold.

    Raises:
        OSError: LMDB refused to open the environment or the database (the message is LMDB's).
        RuntimeError: :data:`AVAILABLE` is False.
    """

    def __init__(self, path: Path, db_name: str, max_dbs: int) -> None:
        if _API is None:
            raise RuntimeError("liblmdb's C API is not available in this process")
        self.pid = os.getpid()
        self._env = ctypes.c_void_p()
        self._txn = ctypes.c_void_p()
        self._check(_API["env_create"](ctypes.byref(self._env)), "mdb_env_create")
        try:
            self._check(_API["env_set_maxdbs"](self._env, max_dbs), "mdb_env_set_maxdbs")
            flags = MDB_RDONLY | MDB_NOLOCK | MDB_NOTLS | MDB_NORDAHEAD
            self._check(_API["env_open"](self._env, os.fsencode(path), flags, 0o644), "open")
            self._check(
                _API["txn_begin"](self._env, None, MDB_RDONLY, ctypes.byref(self._txn)),
                "mdb_txn_begin",
            )
            dbi = ctypes.c_uint()
            self._check(
                _API["dbi_open"](self._txn, db_name.encode(), 0, ctypes.byref(dbi)), "dbi_open"
            )
            self.dbi = dbi.value
        except BaseException:
            self.close()
            raise

    @property
    def txn(self) -> int:
        """The read transaction's address (for :func:`gather_records`)."""
        return self._txn.value or 0

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what}: {_API['strerror'](rc).decode(errors='replace')}")

    @staticmethod
    def strerror(rc: int) -> str:
        """LMDB's message for an error code."""
        return _API["strerror"](rc).decode(errors="replace")

    def close(self) -> None:
        """End the transaction and close the environment (only in the process that opened it)."""
        if os.getpid() != self.pid:
            return  # another process's mapping: never touch it
        if self._txn.value:
            _API["txn_abort"](self._txn)
            self._txn = ctypes.c_void_p()
        if self._env.value:
            _API["env_close"](self._env)
            self._env = ctypes.c_void_p()


_mdb_get = types.ExternalFunction(
    "hogwild_mdb_get", types.int32(types.uint64, types.uint32, types.uint64, types.uint64)
)
_memcpy = types.ExternalFunction(
    "hogwild_memcpy", types.uint64(types.uint64, types.uint64, types.uint64)
)


@njit(cache=True, nogil=True)
def gather_records(txn, dbi, addresses, indices, out, labels, prefix, record_size, error):
    """Copy records ``indices`` into ``out`` rows and ``labels``; 0 or a status code.

    Only callable when :data:`AVAILABLE` (the JIT links ``mdb_get`` by name).

    Args:
        txn: The read transaction's address (:attr:`NativeEnv.txn`).
        dbi: The records database (:attr:`NativeEnv.dbi`).
        addresses: uint64 ``[N]``, each record's address once looked up (0: not yet).
        indices: int64 ``[n]`` record indices.
        out: uint8 ``[n, H*W*C]`` rows receiving the pixels.
        labels: int32 ``[n]`` receiving the labels.
        prefix: uint64 ``[2]``, the header prefix every record must start with.
        record_size: Bytes of one record.
        error: int64 ``[3]``; on failure (position in the batch, record index, detail).
    """
    key = np.empty(8, np.uint8)
    key_val = np.empty(2, np.uint64)
    data_val = np.empty(2, np.uint64)
    header = np.empty(3, np.uint64)
    key_val[0] = 8
    key_val[1] = key.ctypes.data
    pixel_bytes = record_size - 24
    for j in range(indices.shape[0]):
        index = indices[j]
        if index < 0 or index >= addresses.shape[0]:
            error[0], error[1], error[2] = j, index, 0
            return STATUS_OUT_OF_RANGE
        address = addresses[index]
        if address == 0:
            x = np.uint64(index)
            for b in range(8):
                key[7 - b] = np.uint8(x & np.uint64(255))
                x = x >> np.uint64(8)
            rc = _mdb_get(txn, dbi, key_val.ctypes.data, data_val.ctypes.data)
            if rc != 0:
                error[0], error[1], error[2] = j, index, rc
                return STATUS_NOT_FOUND if rc == _MDB_NOTFOUND else STATUS_MDB_ERROR
            if data_val[0] != record_size:
                error[0], error[1], error[2] = j, index, data_val[0]
                return STATUS_BAD_SIZE
            address = data_val[1]
            addresses[index] = address
        _memcpy(header.ctypes.data, address, 24)
        if header[0] != prefix[0] or header[1] != prefix[1]:
            error[0], error[1], error[2] = j, index, 0
            return STATUS_BAD_HEADER
        labels[j] = np.int32(np.uint32(header[2] & np.uint64(0xFFFFFFFF)))
        _memcpy(out[j].ctypes.data, address + np.uint64(24), pixel_bytes)
    return STATUS_OK
