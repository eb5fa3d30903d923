"""The ``ps`` parameter store: a replica's copies exchanged with Adam's parameter servers.

Registered as ``train.parameters = "ps"`` (entry point ``hogwild.parameter_stores``). It is the
engine's copies store (:class:`hogwild.store.copies.CopiesStore`, subclassed through the seam its
module docstring declares public: a copy per worker, or per NUMA
node, in the replica's arena, pushed every ``train.n_push`` examples and pulled every
``train.n_fetch`` by each copy's communication thread) whose home is the parameter servers of
``ps.servers`` instead of a copy in shared memory: DistBelief's model replica (section 4.1) and
Adam's (section 3.3). Pushes go through :class:`~hogwild_plugins.ps.client.PSClient`: the fully
connected layers as their k activation and error vectors (API b, Adam section 3.2.6) when each
copy has one writer and ``train.fc_push`` says so (``auto``: to remote servers, where they are the
fewer floats), the rest as accumulated deltas (API a), each stamped with the shard
versions the copy last pulled so the servers can decay or refuse stale updates. A pull fetches
every shard's values and versions, or, for a home told the rows it serves
(:meth:`RemoteHome.own`: a model partition's, or a partition host's), only the shards they lie
in; :attr:`RemoteHome.fetched_bytes` counts what the pulls brought.

The parent keeps a client too: at the start it takes the model the servers hold (a server
initialises its parameters as the trainer does, from ``model.init`` and ``train.seed``, or
recovers them from its store), so a job joins a running model rather than resetting it; fresh
servers (every shard at version 0) are given the job's initial or restored parameters instead.
At every epoch end, with every worker flushed, it pulls the servers' model into the arena's home
copy and gives it to every copy, for evaluation and the checkpoint.
"""

from __future__ import annotations

import secrets

import numpy as np

from hogwild.config.topology import etcd_group
from hogwild.errors import ConfigError
from hogwild.store.copies import CopiesStore, fc_layers
from hogwild.store.exchange import FcLayer, Home, VectorBuffer


class RemoteHome(Home):
    """The parameter servers, reached from a copy's communication thread."""

    def __init__(self, client, n_params: int) -> None:
        # The kernels load with the first home, in the copy's leader that runs them: the driver,
        # which only gives and pulls the model, loads no numba for the store.
        from hogwild.store import kernels

        self.kernels = kernels
        self.client = client
        self.send = np.zeros(n_params, dtype=np.float32)  # what a push sends, by range
        client.pin(self.send)  # its ranges go out as long-lived frames
        self.values = np.zeros(n_params, dtype=np.float32)  # what a pull receives
        self.basis: np.ndarray | None = None  # shard versions the copy last pulled
        self.shards: list[int] | None = None  # the shards a pull brings (None: all)
        self.pull_bytes = 4 * n_params  # what one pull brings

    def own(self, ranges) -> None:
        """A model partition's rows (or a host's partitions'): its pulls bring only the shards
        they lie in."""
        layout = self.client.layout
        cut = layout.cut([(int(lo), int(hi)) for lo, hi in ranges])
        self.shards = sorted({shard for shard, _, _ in cut})
        spans = (layout.shard_range(shard) for shard in self.shards)
        self.pull_bytes = 4 * sum(hi - lo for lo, hi in spans)

    def push(self, copy, base, ranges) -> None:
        self.kernels.take_deltas(self.send, copy, base, ranges)
        spans = [(int(lo), int(hi)) for lo, hi in ranges]
        self.client.push_deltas(self.send, basis=self.basis, ranges=spans)

    def fetch(self) -> np.ndarray:
        if self.shards is None:
            self.basis = self.client.pull(self.values)
        else:  # the versions of the shards not pulled stay 0: no decay is asked for them
            if self.basis is None:
                self.basis = np.zeros(self.client.layout.n_shards, dtype=np.uint64)
            self.basis[self.shards] = self.client.pull(self.values, shards=self.shards)
        self.fetched_bytes += self.pull_bytes
        return self.values

    def merge(self, values, copy, base, ranges) -> None:
        self.kernels.merge_pulled(values, copy, base, ranges)

    def versions(self) -> np.ndarray | None:
        """The shard versions it last pulled (those of shards it does not pull: 0)."""
        return self.basis

    def adopt(self, versions: np.ndarray) -> None:
        """Its pushes stamped with ``versions`` over the shards it pulls (all, or its own)."""
        n_shards = self.client.layout.n_shards
        if len(versions) < n_shards:
            raise ValueError(f"{len(versions)} shard versions adopted, the layout has {n_shards}")
        if self.basis is None:
            self.basis = np.zeros(n_shards, dtype=np.uint64)
        which = slice(None) if self.shards is None else self.shards
        self.basis[which] = np.asarray(versions[:n_shards], dtype=np.uint64)[which]

    def exchange(self, copy, base, ranges) -> np.ndarray:
        """Push and pull in one exchange with the servers (:meth:`PSClient.push_and_pull`)."""
        if self.shards is not None:  # a partition's: push, then pull its own shards
            self.push(copy, base, ranges)
            values = self.fetch()
            self.kernels.merge_pulled(values, copy, base, ranges)
            return values
        self.kernels.take_deltas(self.send, copy, base, ranges)
        spans = [(int(lo), int(hi)) for lo, hi in ranges]
        self.basis = self.client.push_and_pull(self.send, self.values, self.basis, spans)
        self.fetched_bytes += self.pull_bytes
        self.kernels.merge_pulled(self.values, copy, base, ranges)
        return self.values

    def push_vectors(self, layers: tuple[FcLayer, ...], buffer: VectorBuffer) -> None:
        rows = buffer.rows
        for i, layer in enumerate(layers):
            self.client.push_vectors(
                layer.index,
                buffer.acts[i][:rows],
                buffer.errs[i][:rows],
                buffer.lr,
                basis=self.basis,
                decay=buffer.decay,
            )

    def cancel(self) -> None:
        self.client.cancel()

    def close(self) -> None:
        self.client.close()


def _client(values: dict, client_id: int):
    from hogwild_plugins.ps.client import PSClient

    return PSClient(
        values["servers"],
        values["job"],
        client_id=client_id,
        timeout_s=values["timeout_s"],
        retries=values["retries"],
        keys=values["keys"] or None,
        etcd=values.get("etcd") or None,
        token=values.get("token", 0),
        etcd_tls=values.get("etcd_tls") or None,
        etcd_group=values.get("etcd_group"),
    )


class PSStore(CopiesStore):
    """Copies per worker (or per node) in the arena, exchanged with the parameter servers."""

    name = "ps"
    home_is_local = False  # every worker trains on a copy: nothing reaches the servers otherwise
    #: With plain SGD on the servers (a single job's rule), every 64 examples, as in shared
    #: memory: plain SGD through the servers every 512 examples sometimes settles a point or
    #: more below every 64 after one epoch of the paper's job; Adagrad on the servers does not.
    cadence = 64
    #: With Adagrad on the servers (Downpour's default: DistBelief found it stabilises it),
    #: Adam's k, "typically in the hundreds" (3.2.6): an exchange with the servers (two 1.2 MB
    #: messages through both sides' threads and the kernel) costs about ten of shared memory's;
    #: every 64 examples it took a third of two shared cores from the workers, every 512 a
    #: tenth, at the same accuracy after the same examples (README, Fig. 11).
    adagrad_cadence = 512

    @classmethod
    def version_words(cls, n_params: int) -> int:
        """A version per shard, for the smallest shards a layout may have."""
        from hogwild_plugins.ps.layout import FLOAT_BYTES, MIN_SHARD_KIB

        return -(-n_params // (MIN_SHARD_KIB * 1024 // FLOAT_BYTES))

    @classmethod
    def own_cadence(cls, config) -> int:
        return cls.adagrad_cadence if config.ps.rule == "adagrad" else cls.cadence

    def __init__(self, config, network, placements) -> None:
        super().__init__(config, network, placements)
        from hogwild_plugins.ps.layout import job_name

        ps = config.ps
        if not ps.servers:
            raise ConfigError(
                "train.parameters = 'ps' needs the parameter servers: --ps HOST:PORT (or "
                'ps.servers = ["HOST:PORT", ...]); start one with `hogwild ps serve`'
            )
        self.reach = {
            "servers": list(ps.servers),
            "job": job_name(config.origin, ps.job),
            "timeout_s": ps.timeout_s,
            "retries": ps.retries,
            "keys": ps.keys,
            "etcd": config.cluster.etcd if config.cluster.copies > 1 else "",
            "token": ps.token,  # a cluster replica's: the driver fences replaced incarnations
            "etcd_tls": config.cluster.etcd_tls if config.cluster.copies > 1 else "",
            "etcd_group": etcd_group(config),  # several server groups: its group's namespace
        }
        self.client = None
        self.joined_version = 0

    def auto_fc_push(self) -> str:
        """Vectors (API b) when a server is on another machine and they are the fewer floats:
        k(M+N) on the wire instead of MN for k = ``n_push`` examples, with the outer products on
        the server's cores (Adam 3.2.6). Deltas when every server shares this machine's cores,
        where the outer products would cost more than the traffic they save, and when k is too
        large for vectors to save anything (Adam's model at the default 512: 988,160 floats of
        vectors against 292,000 weights; they pay below k = 151)."""
        from hogwild.net.address import is_loopback, parse_address

        remote = any(not is_loopback(parse_address(a)) for a in self.config.ps.servers)
        vectors = self.n_push * sum(f.n_in + f.n_out for f in self.layers)
        weights = sum(f.n_in * f.n_out for f in self.layers)
        return "vectors" if remote and vectors < weights else "deltas"

    def attach(self, arena) -> None:
        super().attach(arena)
        self.client = _client(self.reach, secrets.randbits(31))
        if self.client.layout.n_params != self.network.n_params:
            raise ConfigError(
                f"the parameter servers {', '.join(self.reach['servers'])} serve a model of "
                f"{self.client.layout.n_params:,} parameters; this job's has "
                f"{self.network.n_params:,}: serve the job's config (hogwild ps serve --config)"
            )

    def load(self, params: np.ndarray, velocity: np.ndarray) -> None:
        versions = self.client.pull(self.params)
        self.joined_version = int(versions.max()) if len(versions) else 0
        if not self.joined_version:  # fresh servers: they get the job's initial or restored model
            self.client.assign(np.ascontiguousarray(params, dtype=np.float32))
            self.params[:] = params
        self.velocity[:] = velocity
        self.spread_home()

    def gather_home(self) -> None:
        """The workers pushed everything when they finished: home is the servers' model."""
        self.client.pull(self.params)

    def home_spec(self, worker: int) -> dict:
        return dict(self.reach)

    @classmethod
    def open_home(cls, spec, arena, network, job) -> Home:
        return RemoteHome(_client(spec.values, secrets.randbits(31)), network.n_params)

    def watch_home(self, alive) -> None:
        """The client's waits on a server ask ``alive()`` (:class:`hogwild.net.channel.Peers`)."""
        self.client.connection.peers.alive = alive

    def home_status(self) -> list[dict]:
        return self.client.status() if self.client is not None else []

    def home_name(self) -> str:
        return f"the parameter servers {', '.join(self.reach['servers'])}"

    def describe(self) -> dict:
        return {**super().describe(), "servers": self.reach["servers"], "job": self.reach["job"]}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


__all__ = ["PSStore", "RemoteHome", "fc_layers"]
