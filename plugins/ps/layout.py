"""Where every parameter lives: shards, buckets, the bucket map, and the model's fc geometry.

Adam (section 3.3.1) cuts the flat parameter vector into 1 MB shards (contiguous ranges; the last
one shorter), hashes the shards into storage buckets and spreads the buckets evenly over the
parameter servers. Here:

* a shard holds ``ps.shard_kib`` KiB of float32 parameters;
* shard ``s`` goes to bucket ``s mod B`` (``B = ps.buckets``, 0 meaning four per server). A
  modulo is the hash: it sends consecutive shards (one layer's) to different buckets and balances
  any number of shards to within one per bucket, where a pseudo-random hash balances only in
  expectation (the MNIST model has two 1 MiB shards: a random hash puts both on one of two
  servers half the time);
* the :class:`BucketMap` gives each bucket a primary server (bucket ``b`` to server
  ``b mod S``, so servers differ by at most one bucket) and a list of secondaries (empty until
  replication fills them). It has a version, which every change raises; clients route
  by the map they hold and compare versions with the servers'.

:meth:`ShardLayout.compute` derives everything from (parameter count, shard size, buckets, server
list), so clients and servers compute the same static map independently; a client also checks
the map each server describes (:meth:`ShardLayout.from_description`) against its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hogwild.errors import HogwildError

__all__ = ["BucketMap", "FcLayer", "LayoutError", "ModelGeometry", "ShardLayout", "job_name"]

FLOAT_BYTES = 4
BUCKETS_PER_SERVER = 4
MIN_SHARD_KIB = 4  # the smallest shard a layout may have
MAX_SHARD_KIB = 32 * 1024


class LayoutError(HogwildError):
    """A layout that cannot be, or servers that disagree about it."""


@dataclass(frozen=True)
class FcLayer:
    """A fully connected layer: its index in the model's layer list and its weight geometry.

    Attributes:
        layer: Index into the model's layers (``model.layers[layer]``).
        offset: Where its weights ``W`` ([n_out, n_in], row-major) start in the flat vector.
        n_in: M, the input size (columns of W).
        n_out: N, the units (rows of W).
    """

    layer: int
    offset: int
    n_in: int
    n_out: int

    @property
    def size(self) -> int:
        return self.n_in * self.n_out


def find_fc(layers: Iterable[FcLayer], layer: int) -> FcLayer | None:
    """The fully connected layer with index ``layer`` in the model's layer list, if any."""
    return next((fc for fc in layers if fc.layer == layer), None)


@dataclass(frozen=True)
class ModelGeometry:
    """What a server must know of the model: the parameter count and the fc layers."""

    n_params: int
    fc_layers: tuple[FcLayer, ...] = ()

    @classmethod
    def from_network(cls, network) -> ModelGeometry:
        """From a :class:`hogwild.model.network.Network` (its fully connected layers)."""
        from hogwild.store.copies import fc_layers

        fcs = tuple(FcLayer(f.index, f.w_off, f.n_in, f.n_out) for f in fc_layers(network))
        return cls(int(network.n_params), fcs)

    def fc(self, layer: int) -> FcLayer | None:
        return find_fc(self.fc_layers, layer)


@dataclass(frozen=True)
class BucketMap:
    """Bucket -> primary server (and secondaries), with a version that every change raises."""

    version: int
    primaries: tuple[int, ...]
    secondaries: tuple[tuple[int, ...], ...]

    @classmethod
    def static(cls, n_buckets: int, n_servers: int) -> BucketMap:
        """The map without replication: bucket ``b`` on server ``b mod n_servers``, version 1."""
        return cls(
            1, tuple(b % n_servers for b in range(n_buckets)), tuple(() for _ in range(n_buckets))
        )

    def describe(self) -> dict:
        return {
            "version": self.version,
            "primaries": list(self.primaries),
            "secondaries": [list(s) for s in self.secondaries],
        }


@dataclass(frozen=True)
class ShardLayout:
    """Shards, buckets and servers of one job (see the module docstring)."""

    n_params: int
    shard_floats: int
    n_buckets: int
    servers: tuple[str, ...]
    map: BucketMap
    fc_layers: tuple[FcLayer, ...] = ()

    @classmethod
    def compute(
        cls,
        n_params: int,
        shard_kib: int,
        buckets: int,
        servers: Sequence[str],
        fc_layers: Iterable[FcLayer] = (),
    ) -> ShardLayout:
        """The static layout every client and server derives from the same inputs.

        Raises:
            LayoutError: No parameters, shards smaller than 4 KiB, no servers, fewer buckets
                than servers.
        """
        if n_params < 1:
            raise LayoutError(f"a model of {n_params} parameters has nothing to serve")
        if not MIN_SHARD_KIB <= shard_kib <= MAX_SHARD_KIB:
            raise LayoutError(
                f"ps.shard_kib = {shard_kib}: expected {MIN_SHARD_KIB} to {MAX_SHARD_KIB} (KiB; a "
                "shard moves in one message, and 32 MiB is the largest buffer-pool block)"
            )
        if not servers:
            raise LayoutError("no parameter servers listed (ps.servers)")
        n_buckets = buckets or BUCKETS_PER_SERVER * len(servers)
        if n_buckets < len(servers):
            raise LayoutError(
                f"ps.buckets = {buckets} is fewer than the {len(servers)} servers: some would "
                "hold nothing; use 0 (four per server) or at least one per server"
            )
        return cls(
            n_params=int(n_params),
            shard_floats=shard_kib * 1024 // FLOAT_BYTES,
            n_buckets=n_buckets,
            servers=tuple(servers),
            map=BucketMap.static(n_buckets, len(servers)),
            fc_layers=tuple(fc_layers),
        )

    @property
    def n_shards(self) -> int:
        return -(-self.n_params // self.shard_floats)

    def shard_range(self, shard: int) -> tuple[int, int]:
        """Global ``[lo, hi)`` of a shard."""
        lo = shard * self.shard_floats
        return lo, min(self.n_params, lo + self.shard_floats)

    def shard_size(self, shard: int) -> int:
        lo, hi = self.shard_range(shard)
        return hi - lo

    def bucket_of(self, shard: int) -> int:
        return shard % self.n_buckets

    def server_of(self, shard: int) -> int:
        """Index (into :attr:`servers`) of the shard's primary."""
        return self.map.primaries[self.bucket_of(shard)]

    def shards_of(self, server: int) -> list[int]:
        return [s for s in range(self.n_shards) if self.server_of(s) == server]

    def cut(self, ranges: Iterable[tuple[int, int]] | None = None) -> list[tuple[int, int, int]]:
        """``(shard, lo, hi)`` pieces (global offsets) of ``ranges`` (default: everything).

        Raises:
            LayoutError: A range outside ``[0, n_params)`` or reversed.
        """
        pieces = []
        for start, stop in [(0, self.n_params)] if ranges is None else ranges:
            if not 0 <= start <= stop <= self.n_params:
                raise LayoutError(f"range [{start}, {stop}) is not within [0, {self.n_params})")
            if start == stop:
                continue
            first, last = start // self.shard_floats, (stop - 1) // self.shard_floats
            for shard in range(first, last + 1):
                lo, hi = self.shard_range(shard)
                pieces.append((shard, max(lo, start), min(hi, stop)))
        return pieces

    def fc(self, layer: int) -> FcLayer | None:
        return find_fc(self.fc_layers, layer)

    def describe(self) -> dict:
        """Plain data (JSON) that :meth:`from_description` reads back."""
        return {
            "n_params": self.n_params,
            "shard_floats": self.shard_floats,
            "n_shards": self.n_shards,
            "n_buckets": self.n_buckets,
            "servers": list(self.servers),
            "map": self.map.describe(),
            "fc_layers": [[f.layer, f.offset, f.n_in, f.n_out] for f in self.fc_layers],
        }

    @classmethod
    def from_description(cls, data: object, origin: str) -> ShardLayout:
        """Read a server's description back, checking every field.

        Raises:
            LayoutError: A missing field or a value of the wrong type or range (naming ``origin``).
        """

        def need(obj, key, kind):
            value = obj.get(key) if isinstance(obj, dict) else None
            if not isinstance(value, kind) or isinstance(value, bool):
                raise LayoutError(f"{origin}: field {key!r} missing or not {kind.__name__}")
            return value

        def ints(values, what, lo, hi):
            if not isinstance(values, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi for v in values
            ):
                raise LayoutError(f"{origin}: {what} must be integers in [{lo}, {hi})")
            return tuple(values)

        n_params = need(data, "n_params", int)
        shard_floats = need(data, "shard_floats", int)
        n_buckets = need(data, "n_buckets", int)
        servers = need(data, "servers", list)
        if n_params < 1 or shard_floats < 1 or n_buckets < 1 or not servers:
            raise LayoutError(f"{origin}: an empty layout")
        if not all(isinstance(s, str) for s in servers):
            raise LayoutError(f"{origin}: servers must be strings")
        m = need(data, "map", dict)
        version = need(m, "version", int)
        primaries = ints(need(m, "primaries", list), "map.primaries", 0, len(servers))
        secondaries = need(m, "secondaries", list)
        if len(primaries) != n_buckets or len(secondaries) != n_buckets:
            raise LayoutError(f"{origin}: the map does not cover the {n_buckets} buckets")
        seconds = tuple(ints(s, "map.secondaries", 0, len(servers)) for s in secondaries)
        fcs = []
        for entry in need(data, "fc_layers", list):
            if not isinstance(entry, list) or len(entry) != 4:
                raise LayoutError(f"{origin}: fc_layers entries must be [layer, offset, M, N]")
            layer, offset, n_in, n_out = ints(entry, "fc_layers", 0, 2**62)
            if offset + n_in * n_out > n_params:
                raise LayoutError(f"{origin}: fc layer {layer} reaches past the parameters")
            fcs.append(FcLayer(layer, offset, n_in, n_out))
        return cls(
            n_params,
            shard_floats,
            n_buckets,
            tuple(servers),
            BucketMap(version, primaries, seconds),
            tuple(fcs),
        )


def job_name(config_origin: str | None, explicit: str | None = None) -> str:
    """A job's name for its id on the wire: ``explicit``, else the config file's stem.

    ``hogwild ps serve --config runs/mnist.toml`` serves job ``mnist``; a replica started with
    the same config file reaches it under the same name. The bundled default config is
    ``adam_mnist``.
    """
    if explicit:
        return explicit
    if config_origin and not config_origin.startswith("<"):
        return Path(config_origin).stem
    return "adam_mnist"
