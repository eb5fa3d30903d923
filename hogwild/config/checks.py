"""Range and consistency checks of a built :class:`~hogwild.config.Config`.

Types and unknown keys are checked while the config is built (:mod:`hogwild.config`); this module
checks what a well-typed config can still get wrong: finite numbers, choices, ranges, and a layer
stack that ends in softmax. Each failure is a :class:`~hogwild.errors.ConfigError` that names the
key (or the layer) and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hogwild.config.augment_spec import AugmentSpec
from hogwild.config.topology import TopologyError, resolve_topology
from hogwild.entry_points import PARAMETER_STORES
from hogwild.entry_points import names as registered_names
from hogwild.errors import ConfigError

# The smallest normal float32. The server's Adagrad kernel divides by sqrt(g) + eps in float32;
# an eps below this rounds to 0 or a subnormal there, and a zero accumulator then gives NaN.
FLOAT32_TINY = 1.1754943508222875e-38

MAX_LEASE_S = 3600
"""The longest etcd lease TTL (seconds) a parameter server may hold (``ps.lease_s``): the one
bound the config, a server's member record (``MemberRecord.parse``) and a client's re-route wait
(``Routes.read``) share. A longer TTL is no hogwild server's, and a client waiting on it after a
primary's death would wait that long. A ``revoked/<i>`` marker's TTL is not bounded by it: the
driver names the member's (so at most this), and a longer one written by hand is waited out as
it is (docs/guarantees.md)."""

PARTITION_PLACEMENTS = ("pack", "spread")  # cluster.partition_placement

# The hosts of a partitioned replica (``model.partition_hosts``) beat to each other this often;
# ``model.partition_silence_s`` may not be shorter than two beats.
PARTITION_BEAT_S = 0.5

# The keys that take one of a fixed set of values. (``train.parameters`` names a registered
# parameter store: :mod:`hogwild.store.registry`.)
CHOICES = {
    ("model", "init"): ("he", "xavier", "torch"),
    ("optim", "rule"): ("sgd", "momentum", "adam", "adamw"),
    ("optim", "schedule"): ("constant", "step", "exponential", "cosine", "linear"),
    ("train", "start_method"): ("spawn", "forkserver"),
    ("train", "placement"): ("fill", "spread"),
    ("train", "replicas"): ("auto", "node", "worker"),
    ("train", "fc_push"): ("auto", "deltas", "vectors"),
    ("ps", "rule"): ("auto", "sgd", "momentum", "adagrad", "staleness"),
    ("ps", "nonfinite"): ("refuse", "count"),
    ("cluster", "evaluate"): ("auto", "between", "beside"),
    ("cluster", "split"): ("portions", "shards"),
    ("cluster", "start_method"): ("forkserver", "spawn"),
    ("cluster", "auth"): ("auto", "always", "beyond-loopback"),  # hogwild.net.exposure
}


def check_config(config: Any, origin: str) -> None:
    """Reject values out of range and combinations that cannot run, naming the key.

    ``config`` is a built :class:`hogwild.config.Config`, read through its sections' fields
    (this module is below the package's ``__init__``, which calls it, and does not import it).

    Raises:
        ConfigError: The first problem found, prefixed with ``origin``.
    """

    def fail(msg: str) -> None:
        raise ConfigError(f"{origin}: {msg}")

    for section in dataclasses.fields(config):
        table = getattr(config, section.name)
        if not dataclasses.is_dataclass(table):
            continue
        for f in dataclasses.fields(table):
            value = getattr(table, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                fail(f"{section.name}.{f.name} must be a finite number, got {value}")
    for (section, key), choices in CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in choices:
            fail(f"{section}.{key} must be one of {', '.join(choices)}; got {value!r}")
    layers = config.model.layers
    if not layers:
        fail("model.layers is empty; the bundled config shows a complete stack")
    for index, layer in enumerate(layers):
        where = f"model.layers[{index}] ({layer.type})"
        if layer.type == "conv":
            if layer.maps < 1 or layer.kernel < 1 or layer.stride < 1:
                fail(f"{where}: maps, kernel and stride must be >= 1")
            if isinstance(layer.padding, int):
                if layer.padding < 0:
                    fail(f"{where}: an integer padding must be >= 0, got {layer.padding}")
            elif layer.padding not in ("valid", "same"):
                fail(
                    f"{where}: padding must be 'valid', 'same' or an integer >= 0, "
                    f"got {layer.padding!r}"
                )
            if layer.padding == "same" and layer.kernel % 2 == 0:
                fail(
                    f"{where}: padding 'same' pads (kernel - 1) / 2 on every side and needs an "
                    f"odd kernel, got {layer.kernel}; use 'valid' or an odd kernel"
                )
        if layer.type in ("maxpool", "avgpool") and (layer.size < 1 or layer.stride < 1):
            fail(f"{where}: size and stride must be >= 1")
        if layer.type == "fc" and layer.units < 1:
            fail(f"{where}: units must be >= 1")
        if layer.type == "dropout" and not 0.0 <= layer.p < 1.0:
            fail(f"{where}: p must be in [0, 1), got {layer.p}")
        if layer.type == "softmax" and index != len(layers) - 1:
            fail(f"{where}: softmax (with cross-entropy) must be the last layer")
    for index, layer in enumerate(layers[:-1]):
        if layer.type == "mse":
            fail(f"model.layers[{index}] (mse): the mean squared error must be the last layer")
    if layers[-1].type not in ("softmax", "mse"):
        fail(
            "the last layer must be softmax (classes, with cross-entropy) or mse (regression), "
            f"got {layers[-1].type}"
        )
    optim, train, out = config.optim, config.train, config.output
    if not optim.lr > 0:
        fail(f"optim.lr must be > 0, got {optim.lr}")
    if not 0.0 <= optim.momentum < 1.0:
        fail(f"optim.momentum must be in [0, 1), got {optim.momentum}")
    if not 0.0 <= optim.beta2 < 1.0:
        fail(f"optim.beta2 must be in [0, 1), got {optim.beta2}")
    if not optim.eps > 0:
        fail(f"optim.eps must be > 0, got {optim.eps}")
    if optim.rule in ("adam", "adamw") and config.model.partitions > 1:
        fail(
            f"optim.rule = {optim.rule!r}: a partitioned replica (model.partitions > 1) updates "
            "its rows with 'sgd' or 'momentum' (Adam's moments are not kept per partition); "
            "choose one, or train with model.partitions = 1"
        )
    if optim.rule in ("adam", "adamw") and train.parameters == "ps":
        fail(
            f"optim.rule = {optim.rule!r} trains on one machine; with train.parameters = 'ps' "
            "the parameter servers apply their own rule (ps.rule)"
        )
    if not config.model.init_scale > 0:
        fail(f"model.init_scale must be > 0, got {config.model.init_scale}")
    if train.seed < 0:
        fail(f"train.seed must be >= 0, got {train.seed}")
    if optim.weight_decay < 0 or optim.min_lr < 0:
        fail("optim.weight_decay and optim.min_lr must be >= 0")
    if not 0.0 < optim.decay <= 1.0:
        fail(f"optim.decay must be in (0, 1], got {optim.decay}")
    if optim.decay_every < 1:
        fail(f"optim.decay_every must be >= 1, got {optim.decay_every}")
    if optim.warmup_epochs < 0:
        fail(f"optim.warmup_epochs must be >= 0, got {optim.warmup_epochs}")
    if train.epochs < 1 or train.batch < 1 or train.chunk < 1:
        fail("train.epochs, train.batch and train.chunk must be >= 1")
    if train.evaluate_every < 0:
        fail(
            "train.evaluate_every must be an integer >= 0 (N: after every N-th epoch and the "
            f"last; 0: only after the last), got {train.evaluate_every!r}"
        )
    if train.update_every < 0:
        fail(
            f"train.update_every must be >= 0 (0: chosen by the trainer), got {train.update_every}"
        )
    _check_exchange(train, fail)
    if train.workers < 0 or train.subset < 0:
        fail("train.workers and train.subset must be >= 0 (0 means: the default)")
    if config.model.partitions < 1 or train.in_flight < 1:
        fail(
            f"model.partitions and train.in_flight must be >= 1, got "
            f"{config.model.partitions} and {train.in_flight}"
        )
    hosts = config.model.partition_hosts
    if hosts and len(hosts) != config.model.partitions:
        fail(
            f"model.partition_hosts names {len(hosts)} host(s), one per partition is needed: "
            f"model.partitions = {config.model.partitions}"
        )
    silence = config.model.partition_silence_s
    if not (math.isfinite(silence) and silence >= 2 * PARTITION_BEAT_S):
        fail(
            f"model.partition_silence_s must be a number of seconds >= {2 * PARTITION_BEAT_S:g} "
            f"(the hosts of a partitioned replica beat every {PARTITION_BEAT_S:g} s: two beats "
            f"missed at least), got {silence}"
        )
    if not train.stall_s > 0:
        fail(f"train.stall_s must be > 0 seconds, got {train.stall_s}")
    if not 0.0 < train.epoch_fraction <= 1.0:
        fail(f"train.epoch_fraction must be in (0, 1], got {train.epoch_fraction}")
    data = config.data
    if data.std <= 0:
        fail(f"data.std must be > 0, got {data.std}")
    if data.ram_budget_mb < 0:
        fail(f"data.ram_budget_mb must be >= 0 (0 means: none), got {data.ram_budget_mb}")
    if data.prefetch_depth < 1:
        fail(f"data.prefetch_depth must be >= 1, got {data.prefetch_depth}")
    if not data.timeout_s > 0:
        fail(f"data.timeout_s must be > 0 seconds, got {data.timeout_s}")
    if not data.wait_s >= 0:
        fail(f"data.wait_s must be >= 0 seconds, got {data.wait_s}")
    if data.augment.strip():
        try:
            AugmentSpec.parse(data.augment)
        except ValueError as exc:
            fail(f"data.augment = {data.augment!r}: {exc}")
    if out.keep_checkpoints < 1:
        fail(f"output.keep_checkpoints must be >= 1, got {out.keep_checkpoints}")
    if out.tensorboard_every < 1:
        fail(f"output.tensorboard_every must be >= 1, got {out.tensorboard_every}")
    _check_ps(config.ps, fail)
    _check_cluster(config.cluster, config.ps.rule, fail)
    _check_etcd_election(config.cluster, config.ps.lease_s, fail)
    if not 0 <= config.ps.server_group < max(1, config.cluster.server_groups):
        fail(
            f"ps.server_group must be 0 to cluster.server_groups - 1 (this role's server group, "
            f"set by the driver), got {config.ps.server_group} with cluster.server_groups = "
            f"{config.cluster.server_groups}"
        )
    _check_push_decay(config, fail)


def _check_push_decay(config, fail) -> None:
    """A cadence the job sets; the store checks its own (0) where it resolves it."""
    if config.train.n_push:
        problem = push_decay_problem(config.optim, config.train.n_push, "train.n_push")
        if problem:
            fail(problem)


def push_decay_problem(optim, n_push: int, what: str) -> str | None:
    """What is wrong when the weight decay one push of vectors carries (``lr x decay x
    n_push``, the fraction of a weight it removes) would remove the whole weight; else None."""
    decay = optim.lr * optim.weight_decay * n_push
    if decay < 1.0:
        return None
    return (
        f"optim.lr x optim.weight_decay x {what} = {decay:g}: the weight decay one push "
        "carries would remove the whole weight; lower train.n_push or the decay"
    )


def _check_exchange(train, fail) -> None:
    """The parameter store, its cadences, and the options that would do nothing in this mode."""
    names = registered_names(PARAMETER_STORES)
    if names and train.parameters not in names:
        fail(
            f"train.parameters must be a parameter store, one of {', '.join(names)}; "
            f"got {train.parameters!r}"
        )
    if train.n_push < 0 or train.n_fetch < 0:
        fail(
            f"train.n_push and train.n_fetch must be >= 1 (examples), or 0 for the store's own "
            f"cadence; got {train.n_push} and {train.n_fetch}"
        )
    if train.cadence_ramp < -1:
        fail(
            f"train.cadence_ramp must be >= 1 (examples a copy trains per step of the ramp), 0 "
            f"for none or -1 for the store's own; got {train.cadence_ramp}"
        )
    if train.batch > 1 and train.update_every > 1:
        fail(
            f"train.update_every = {train.update_every} does nothing at train.batch = "
            f"{train.batch}: it groups the fully connected updates of per-example SGD (batch 1); "
            "remove it or set train.batch = 1"
        )
    if train.parameters == "shared":
        defaults = type(train)()
        for key in ("n_push", "n_fetch", "cadence_ramp", "fc_push", "replicas"):
            if getattr(train, key) != getattr(defaults, key):
                fail(
                    f"train.{key} = {getattr(train, key)!r} does nothing with train.parameters = "
                    "'shared' (every worker writes the one copy: there is nothing to push or "
                    "pull); remove it or choose train.parameters = 'replicate'"
                )


def _check_ps(ps, fail) -> None:
    if not ps.lr >= 0:
        fail(f"ps.lr must be >= 0 (0: the rule's default), got {ps.lr}")
    if not 0.0 <= ps.momentum < 1.0:
        fail(f"ps.momentum must be in [0, 1), got {ps.momentum}")
    if not 0.0 < ps.staleness_decay <= 1.0:
        fail(f"ps.staleness_decay must be in (0, 1], got {ps.staleness_decay}")
    if ps.max_staleness < 0 or ps.buckets < 0 or ps.retries < 0:
        fail("ps.max_staleness, ps.buckets and ps.retries must be >= 0 (0: unlimited / automatic)")
    if not ps.adagrad_eps >= FLOAT32_TINY:
        fail(
            f"ps.adagrad_eps must be > 0 and representable in float32 (>= {FLOAT32_TINY:.3g}), "
            f"got {ps.adagrad_eps}"
        )
    if ps.shard_kib < 4:
        fail(f"ps.shard_kib must be >= 4 (KiB per shard; Adam uses 1024), got {ps.shard_kib}")
    if not 1 <= ps.max_vectors <= 4096:
        fail(f"ps.max_vectors must be 1 to 4096 (named vectors per shard), got {ps.max_vectors}")
    if ps.min_copies < 0:
        fail(f"ps.min_copies must be >= 0 (0: half the copies, rounded up), got {ps.min_copies}")
    if not 0 <= ps.token < 2**64:
        fail(f"ps.token must be 0 to 2**64 - 1 (a replica's fencing token), got {ps.token}")
    if not 0 <= ps.lease_s <= MAX_LEASE_S:
        fail(
            f"ps.lease_s must be 0 (auto) to {MAX_LEASE_S} seconds (a whole number), "
            f"got {ps.lease_s}"
        )
    if not ps.flush_s > 0 or not ps.timeout_s > 0:
        fail(
            f"ps.flush_s and ps.timeout_s must be > 0 seconds, got {ps.flush_s} and {ps.timeout_s}"
        )


DEFAULT_ELECTION_MS = 200  # plugins/ps/etcd_process.ELECTION_MS (the engine imports no plugin)
MAX_ELECTION_MS = 5_000
"""The longest ``cluster.etcd_election_ms``: hogwild waits 20 s for one etcd it starts to be
ready (30 s for its loopback cluster: ``EtcdProcess.start``, ``EtcdCluster.start``, which the
controller calls with those defaults), and a fresh member may wait about two election timeouts
(raft's randomised timeout is in [et, 2et)) to elect its first leader: 10 s at most here, the
other half of the wait left to the processes' start on a loaded host. An election timeout of
10x the members' round trip (etcd's advice) covers 500 ms round trips, farther apart than any
two hosts on one continent. Scaling the start waits with it instead would make a start that
fails wait minutes before saying so, and every failover (about three election timeouts) as
slow."""


def etcd_election_unread(cluster) -> str | None:
    """Why ``cluster.etcd_election_ms``, set, is not read (None when it is, or is 0): hogwild
    starts etcd members only for copies of its servers (``cluster.copies`` > 1) and only where
    ``cluster.etcd`` asks it to (empty or ``"job"``); an etcd given keeps its own timers. Not
    refused (the driver hands its roles the config with ``cluster.etcd`` the address of the
    etcd it started), but the driver warns of it once."""
    if not cluster.etcd_election_ms:
        return None
    given = cluster.etcd.strip() not in ("", "job")
    if cluster.copies < 2 or given:
        why = f"cluster.etcd = {cluster.etcd!r} is given" if given else "cluster.copies = 1"
        return (
            f"cluster.etcd_election_ms = {cluster.etcd_election_ms} is not read: {why}, so "
            "hogwild starts no etcd member (an etcd given keeps its own election timeout)"
        )
    return None


def etcd_election_out_of_range(election_ms: int) -> str | None:
    """Why ``cluster.etcd_election_ms`` (a number) is out of the range hogwild can start members
    with, or None: 0 (hogwild's own) or 10 to :data:`MAX_ELECTION_MS`. The job config's check
    and the parameter servers' options both ask it."""
    if election_ms == 0 or 10 <= election_ms <= MAX_ELECTION_MS:
        return None
    return (
        f"cluster.etcd_election_ms must be 0 (hogwild's, {DEFAULT_ELECTION_MS}) or 10 to "
        f"{MAX_ELECTION_MS} milliseconds (the members' heartbeat is a tenth of it; a longer "
        "one's first election can outlast the 20 s hogwild waits for its etcd to start), "
        f"got {election_ms}"
    )


def _check_etcd_election(cluster, lease_s: int, fail) -> None:
    """``cluster.etcd_election_ms``: 0 or within the range hogwild can start members with and,
    where it is read (:func:`etcd_election_unread`), short enough for the lease (etcd grants no
    lease shorter than 1.5 election timeouts)."""
    election_ms = cluster.etcd_election_ms
    if election_ms == 0:
        return
    out_of_range = etcd_election_out_of_range(election_ms)
    if out_of_range is not None:
        fail(out_of_range)
    floor_ms = election_ms * 1.5
    if lease_s and floor_ms > lease_s * 1000 and etcd_election_unread(cluster) is None:
        fail(
            f"cluster.etcd_election_ms = {election_ms} needs ps.lease_s >= "
            f"{math.ceil(floor_ms / 1000)} (got {lease_s}): etcd grants no lease shorter than "
            f"1.5 election timeouts ({floor_ms:g} ms); or give cluster.etcd_election_ms <= "
            f"{int(lease_s * 1000 / 1.5)}"
        )


def _check_cluster(cluster, ps_rule: str, fail) -> None:
    if cluster.replicas < 1 or cluster.workers_per_replica < 1 or cluster.ps < 1:
        fail(
            "cluster.replicas, cluster.workers_per_replica and cluster.ps must be >= 1, got "
            f"{cluster.replicas}, {cluster.workers_per_replica} and {cluster.ps}"
        )
    if cluster.copies < 1:
        fail(f"cluster.copies must be >= 1 (1: no replication), got {cluster.copies}")
    if cluster.partition_placement not in PARTITION_PLACEMENTS:
        fail(
            f"cluster.partition_placement must be one of {', '.join(PARTITION_PLACEMENTS)} (a "
            "partitioned replica's partitions on one Ray node, or each on a node of its own), "
            f"got {cluster.partition_placement!r}"
        )
    try:
        topology = resolve_topology(cluster, ps_rule)
    except TopologyError as exc:
        fail(str(exc))
    if min(cluster.data_servers, cluster.warm_start, cluster.metrics_port, cluster.restarts) < 0:
        fail(
            "cluster.data_servers, cluster.warm_start, cluster.metrics_port and cluster.restarts "
            "must be >= 0"
        )
    roles = topology.servers + cluster.data_servers + topology.worker_groups
    last_port = cluster.metrics_port + roles
    if cluster.metrics_port and last_port > 65535:
        fail(
            f"cluster.metrics_port = {cluster.metrics_port}: the job's roles take ports up to "
            f"{last_port}, past 65535; choose a lower first port"
        )
    if cluster.lbfgs_batch < 0 or cluster.lbfgs_iterations < 1 or cluster.lbfgs_history < 1:
        fail(
            "cluster.lbfgs_batch must be >= 0 (0: the whole share) and cluster.lbfgs_iterations "
            f"and cluster.lbfgs_history >= 1, got {cluster.lbfgs_batch}, "
            f"{cluster.lbfgs_iterations} and {cluster.lbfgs_history}"
        )
    if cluster.lbfgs_batch_growth < 1.0:
        fail(
            "cluster.lbfgs_batch_growth must be >= 1 (the L-BFGS batch's factor from one epoch "
            f"to the next; 1: a fixed batch), got {cluster.lbfgs_batch_growth}"
        )
    if cluster.lbfgs_warm_start < 0:
        fail(
            "cluster.lbfgs_warm_start must be >= 0 (examples of synchronous SGD before L-BFGS "
            f"begins; 0: none), got {cluster.lbfgs_warm_start}"
        )
    if topology.optimizer != "lbfgs" and (
        cluster.lbfgs_batch
        or cluster.lbfgs_iterations != 1
        or cluster.lbfgs_history != 10
        or cluster.lbfgs_warm_start
        or cluster.lbfgs_batch_growth != 1.0
    ):
        fail(
            "cluster.lbfgs_batch, cluster.lbfgs_iterations, cluster.lbfgs_history, "
            "cluster.lbfgs_warm_start and cluster.lbfgs_batch_growth set Sandblaster's L-BFGS, "
            f"but cluster.optimizer is {topology.optimizer!r}; remove them"
        )
    if cluster.lbfgs_batch_growth != 1.0 and not cluster.lbfgs_batch:
        fail(
            f"cluster.lbfgs_batch_growth = {cluster.lbfgs_batch_growth} grows mini-batches, but "
            "cluster.lbfgs_batch = 0 is the full batch; give the first epoch's batch, e.g. "
            "cluster.lbfgs_batch = 5000"
        )
    if not 0.0 < cluster.epoch_fraction <= 1.0:
        fail(f"cluster.epoch_fraction must be in (0, 1], got {cluster.epoch_fraction}")
    if not (cluster.status_s > 0 and cluster.start_timeout_s > 0 and cluster.stop_timeout_s > 0):
        fail("cluster.status_s, cluster.start_timeout_s and cluster.stop_timeout_s must be > 0")
    if cluster.etcd.strip() == "job" and cluster.copies < 2:
        fail(
            f'cluster.etcd = "job" starts an etcd cluster for the copies of replicated '
            f"parameter servers, but cluster.copies = {cluster.copies}: give copies > 1, or "
            "leave cluster.etcd empty"
        )
    if cluster.etcd.strip() == "job" and cluster.launcher not in ("local", "ray"):
        fail(
            f'cluster.etcd = "job" with cluster.launcher = {cluster.launcher!r}: the job\'s own '
            "etcd cluster runs on this host's loopback (local launcher) or one member per Ray "
            'node (ray launcher); give cluster.etcd = "HOST:PORT,HOST:PORT,..." of an etcd '
            "cluster every node can reach"
        )
    if cluster.etcd_tls != cluster.etcd_tls.strip():  # " job" would be a directory " job"
        fail(
            f"cluster.etcd_tls = {cluster.etcd_tls!r}: leading or trailing spaces; expected "
            '"job" or the path of a directory of etcd certificates, without them'
        )
    if cluster.etcd_tls == "job" and (cluster.copies < 2 or cluster.launcher != "ray"):
        fail(
            f'cluster.etcd_tls = "job" with cluster.copies = {cluster.copies} and '
            f"cluster.launcher = {cluster.launcher!r}: the job makes etcd certificates for the "
            'etcd cluster it starts on Ray nodes (cluster.etcd = "job", copies > 1, launcher '
            '"ray"); leave cluster.etcd_tls empty, or give DIR of certificates your etcd trusts'
        )
    if cluster.copies > 1 and not cluster.etcd and cluster.launcher != "local":
        fail(
            f"cluster.copies = {cluster.copies} with cluster.launcher = {cluster.launcher!r}: "
            'give cluster.etcd = "HOST:PORT" (or an etcd cluster\'s members, '
            '"HOST:PORT,HOST:PORT,..."), an etcd every node can reach (the one '
            "hogwild cluster starts listens on this host's loopback only)"
        )
    if not cluster.host.strip():
        fail("cluster.host must name the host the roles bind and advertise, e.g. 127.0.0.1")
