"""The job configuration: a commented TOML file turned into typed, validated, immutable objects.

Invariant: a :class:`Config` that exists is valid on its own terms. Every key is known, every value
has the right type and range, and the layer stack is well formed (softmax last, known layer types).
Whether the layer shapes fit together is checked when the network is built
(:func:`hogwild.model.network.build_network`), which names the layer and the shapes.

A config is loaded from the bundled default (``hogwild/configs/adam_mnist.toml``) or a user file
(a file without ``[model] layers`` is laid over the bundled job), then overridden by
``section.key=value`` pairs (the CLI's ``--key=value``). The resolved config is saved into every
checkpoint and metrics file (:meth:`Config.to_dict`).

The package also holds what a config's values mean before anything runs, so that checking them
imports nothing above the configuration: the range and consistency checks
(:mod:`hogwild.config.checks`), the cluster topology a ``[cluster]`` section resolves to
(:mod:`hogwild.config.topology`) and the grammar of ``data.augment``
(:mod:`hogwild.config.augment_spec`).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from hogwild.config.checks import check_config
from hogwild.errors import ConfigError

# Per layer type: the keys it takes and their defaults (None = required).
LAYER_KEYS: dict[str, dict[str, Any]] = {
    "conv": {"maps": None, "kernel": None, "stride": 1, "padding": "valid"},
    "maxpool": {"size": 2, "stride": None},
    "avgpool": {"size": 2, "stride": None},
    "fc": {"units": None},
    "relu": {},
    "tanh": {},
    "sigmoid": {},
    "dropout": {"p": 0.5},
    "softmax": {},
    "mse": {},  # regression: the last fc layer's outputs against target values, mean squared
}

POOLS = ("maxpool", "avgpool")  # pooling layers: the stride is the window's size unless given


@dataclass(frozen=True)
class LayerConfig:
    """One layer of the stack: its type and its (validated) settings."""

    type: str
    maps: int = 0
    kernel: int = 0
    stride: int = 1
    padding: str | int = "valid"  # "valid", "same" or zeros added on every side (int >= 0)
    size: int = 0
    units: int = 0
    p: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The keys this layer type takes, as they would be written in TOML."""
        out: dict[str, Any] = {"type": self.type}
        for key in LAYER_KEYS[self.type]:
            out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class ModelConfig:
    """The network: input shape, layer stack, initialisation."""

    input: tuple[int, int, int] = (1, 28, 28)
    init: str = "he"
    init_scale: float = 1.0
    layers: tuple[LayerConfig, ...] = ()
    partitions: int = 1  # processes one replica's layers are split over (docs/partitioning.md)
    partition_hosts: tuple[str, ...] = ()  # per partition, the HOST:PORT of the host running it
    partition_silence_s: float = 30.0  # a partition host unheard for this long is lost

    def without_dropout(self) -> ModelConfig:
        """The same network without its dropout layers: Adam's model as the paper gives it (the
        bundled job adds dropout for its schedule), which the peers and oracles compute."""
        return replace(self, layers=tuple(x for x in self.layers if x.type != "dropout"))


@dataclass(frozen=True)
class OptimConfig:
    """The update rule and its learning-rate schedule."""

    rule: str = "sgd"
    lr: float = 0.003
    momentum: float = 0.9  # adam, adamw: beta1
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0005
    schedule: str = "step"
    decay: float = 0.5
    decay_every: int = 3
    min_lr: float = 0.0
    warmup_epochs: int = 0
    smooth: bool = False  # the rate moves within each epoch towards the next epoch's


@dataclass(frozen=True)
class TrainConfig:
    """How the engine trains: epochs, batch, workers, epoch-end policy, seed."""

    epochs: int = 12
    batch: int = 1
    workers: int = 0
    sync: bool = False
    epoch_fraction: float = 1.0
    seed: int = 1
    subset: int = 0
    # forkserver: workers forked from one server that imported numba once (hogwild.training.zygote);
    # spawn: each worker a fresh interpreter that imports it again
    start_method: str = "forkserver"
    chunk: int = 256
    placement: str = "fill"
    update_every: int = 0
    parameters: str = "replicate"
    replicas: str = "auto"
    n_push: int = 0  # 0: the parameter store's own cadence
    n_fetch: int = 0
    # examples a copy trains per step of its cadence's ramp at the job's start; -1: the store's own
    cadence_ramp: int = -1
    fc_push: str = "auto"
    stall_s: float = 120.0
    in_flight: int = 1  # examples a partitioned replica works on at once (model.partitions > 1)
    evaluate_every: int = 1  # epochs between test-set evaluations; 0: only after the last

    def evaluates_after(self, epoch: int) -> bool:
        """Whether the epoch ``epoch`` (from 0) ends with an evaluation on the test set: every
        ``evaluate_every``-th epoch, and always the last one."""
        if epoch + 1 >= self.epochs:
            return True
        return self.evaluate_every > 0 and (epoch + 1) % self.evaluate_every == 0


@dataclass(frozen=True)
class PsConfig:
    """Adam's parameter server (``train.parameters = "ps"``, ``hogwild ps serve``)."""

    servers: tuple[str, ...] = ()
    job: str = ""
    rule: str = "auto"
    lr: float = 0.0
    momentum: float = 0.9
    staleness_decay: float = 0.9
    max_staleness: int = 0
    adagrad_eps: float = 1e-8
    shard_kib: int = 1024
    buckets: int = 0
    flush_s: float = 2.0
    timeout_s: float = 5.0
    retries: int = 3
    keys: str = ""
    lease_s: int = 0
    nonfinite: str = "refuse"  # a write holding NaN or inf: "refuse" it, or "count" and apply
    max_vectors: int = 32  # named vectors a shard holds at most (vector operations, Sandblaster)
    min_copies: int = 0
    token: int = 0  # the fencing token a cluster replica's requests carry (set by its driver)
    server_group: int = 0  # the role's server group, with several: its etcd namespace (driver)


@dataclass(frozen=True)
class ClusterConfig:
    """The roles of ``hogwild cluster``: replicas, parameter servers, data servers, launcher.

    ``framework`` to ``optimizer`` are SINGA's topology (worker groups, server groups); they are
    resolved together with ``replicas``, ``workers_per_replica`` and ``ps`` by
    :func:`hogwild.config.topology.resolve_topology`, whose docstring has the mapping.
    """

    replicas: int = 2
    workers_per_replica: int = 1
    ps: int = 1
    framework: str = ""
    worker_groups: int = 0
    workers_per_group: int = 0
    server_groups: int = 0
    servers_per_group: int = 0
    sync_every: int = 0
    optimizer: str = ""
    data_servers: int = 0
    launcher: str = "local"
    ray_address: str = ""
    host: str = "127.0.0.1"
    keys: str = ""
    auth: str = "auto"
    warm_start: int = 0
    lbfgs_batch: int = 0  # Sandblaster: examples per L-BFGS batch; 0 = the whole share
    lbfgs_iterations: int = 1  # Sandblaster: L-BFGS iterations on each batch
    lbfgs_history: int = 10  # Sandblaster: L-BFGS pairs kept (m)
    lbfgs_warm_start: int = 0  # Sandblaster: examples of synchronous SGD before L-BFGS begins
    lbfgs_batch_growth: float = 1.0  # Sandblaster: the L-BFGS batch's factor from epoch to epoch
    epoch_fraction: float = 1.0
    split: str = "portions"
    metrics_port: int = 0
    status_s: float = 1.0
    evaluate: str = "auto"
    start_method: str = "forkserver"  # local roles: forked from a preloaded server, or spawned
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 20.0
    restarts: int = 3
    copies: int = 1
    # a partitioned replica's partitions (model.partitions > 1) on the Ray launcher: "pack" (one
    # node, one shared arena) or "spread" (each on a node of its own, blocks as frames)
    partition_placement: str = "pack"
    etcd: str = ""
    etcd_tls: str = ""  # a directory of etcd certificates: HTTPS with client certificates
    # the election timeout (ms) of every etcd member hogwild starts (cluster.etcd "" or "job");
    # 0: hogwild's (etcd_process.ELECTION_MS, 200: a cut leader's host costs a lease ~0.6 s)
    etcd_election_ms: int = 0
    group_servers: tuple[str, ...] = ()  # every server group's servers (the driver sets it)


@dataclass(frozen=True)
class DataConfig:
    """Where the examples come from, how they vary between epochs, how pixels are normalised."""

    source: str = "mnist"
    mean: float = 0.1307
    std: float = 0.3081
    augment: str = ""
    ram_budget_mb: int = 0
    prefetch_depth: int = 2
    servers: tuple[str, ...] = ()
    timeout_s: float = 2.0
    wait_s: float = 60.0  # a start's wait for any data server to answer, asked every second,
    # and the driver's hold of a replica's restart while every data server is silent


@dataclass(frozen=True)
class OutputConfig:
    """What the job writes: checkpoints, metrics, the progress bar."""

    checkpoint_dir: str = ""
    keep_checkpoints: int = 2
    metrics: str = ""
    progress: bool = True
    tensorboard: str = ""  # a TensorBoard log directory; "" = none
    tensorboard_every: int = 100  # updates between TensorBoard's training scalars


@dataclass(frozen=True)
class Config:
    """A whole job: model, optimizer, training, data, output."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    ps: PsConfig = field(default_factory=PsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    origin: str = "<defaults>"

    def __post_init__(self) -> None:
        # Built in Python (or by dataclasses.replace) as from a file: checked the same way.
        check_config(self, self.origin)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data (what checkpoints and metrics record)."""
        out: dict[str, Any] = {}
        for section in SECTIONS:
            values = dataclasses.asdict(getattr(self, section))
            if section == "model":
                values["input"] = list(self.model.input)
                values["layers"] = [layer.to_dict() for layer in self.model.layers]
                values["partition_hosts"] = list(self.model.partition_hosts)
            if section in ("ps", "data"):
                values["servers"] = list(values["servers"])
            if section == "cluster":
                values["group_servers"] = list(values["group_servers"])
            out[section] = values
        return out

    def override(self, overrides: Mapping[str, Any]) -> Config:
        """A copy with ``section.key`` (or ``model.layers.N.key``) values replaced and re-validated.

        String values are parsed as TOML literals when they are one (``"0.05"`` becomes a float),
        so the CLI's ``--optim.lr=0.05`` and the API's ``{"optim.lr": 0.05}`` mean the same.
        """
        data = self.to_dict()
        for dotted, raw in overrides.items():
            _set_dotted(data, dotted, _parse_literal(raw) if isinstance(raw, str) else raw)
        return config_from_dict(data, origin=self.origin)


SECTIONS = ("model", "optim", "train", "data", "output", "ps", "cluster")
SECTION_TYPES = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "output": OutputConfig,
    "ps": PsConfig,
    "cluster": ClusterConfig,
}


#: ``ps.lr`` when it is 0: a multiplier of 1 for the rules that add the pushed deltas, and Adagrad's
#: base step (its first step moves a weight by about this much, later steps less).
PS_DEFAULT_LR = {"sgd": 1.0, "momentum": 1.0, "staleness": 1.0, "adagrad": 0.01}


def ps_update_rule(ps: PsConfig, downpour: bool = False) -> tuple[str, float]:
    """The parameter servers' rule and step: ``ps.rule`` and ``ps.lr``, or their defaults.

    ``"auto"`` is Adagrad for Downpour across several replicas (``hogwild cluster``; DistBelief
    found it stabilises Downpour, section 4.1) and plain SGD for one replica (``hogwild train
    --ps``), whose copies' pushed deltas the servers then add as they are.
    """
    rule = ps.rule if ps.rule != "auto" else ("adagrad" if downpour else "sgd")
    return rule, ps.lr or PS_DEFAULT_LR[rule]


def default_config_path() -> Path:
    """The bundled config: Adam's MNIST model."""
    return Path(str(resources.files("hogwild") / "configs" / "adam_mnist.toml"))


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Load a config (the bundled default when ``path`` is None) and apply overrides.

    A ``.json`` file holds a resolved config as :meth:`Config.to_dict` writes it (what
    ``hogwild cluster`` hands its roles); anything else is read as TOML. A file without
    ``[model] layers`` is a partial config: its keys are laid over the bundled job's (``[train]
    epochs = 2`` is the bundled job for two epochs). A file with them is a whole job, its
    missing keys taking the built-in defaults.
    """
    path = Path(path) if path is not None else default_config_path()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
    if _partial(data) and path != default_config_path():
        data = _layered(_bundled_data(), data)
    config = config_from_dict(data, origin=str(path))
    return config.override(overrides) if overrides else config


def _partial(data: Any) -> bool:
    """Whether a config file leaves the network out: then it changes the bundled job."""
    if not isinstance(data, Mapping):
        return False  # config_from_dict says what is wrong with it
    model = data.get("model", {})
    return not (isinstance(model, Mapping) and "layers" in model)


def _bundled_data() -> dict[str, Any]:
    return tomllib.loads(default_config_path().read_text())


def _layered(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s tables merged in key by key (``top`` wins; lists are replaced)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _layered(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> Config:
    """Build and validate a Config from nested plain data (a parsed TOML file)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: the config must be a table, got {type(data).__name__}")
    data = _migrate(data)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}"
        )
    sections = {}
    for name in SECTIONS:
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{origin}: [{name}] must be a table, got {table!r}")
        sections[name] = _build_section(name, table, origin)
    return Config(**sections, origin=origin)  # checked on construction


OLD_CADENCE = 64  # train.n_push's and n_fetch's default before 0 meant the store's own
CADENCES = ("n_push", "n_fetch")


def _migrate(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Read configs written by earlier versions (and the checkpoints that record them).

    ``train.parameters = "interleave"`` is now ``"shared"`` (whose replica and exchange keys did
    nothing, and are dropped); ``train.exchange_every`` became the two cadences
    ``train.n_push`` and ``train.n_fetch``; and those defaulted to 64 before 0 (the store's own)
    did, so a shared job's record of the old default is dropped too.
    """
    train = data.get("train")
    if not isinstance(train, Mapping):
        return data
    if train.get("parameters") == "shared" and OLD_CADENCE in (
        train.get("n_push"),
        train.get("n_fetch"),
    ):
        train = {k: v for k, v in train.items() if k not in CADENCES or v != OLD_CADENCE}
        data = {**data, "train": train}
    if train.get("parameters") != "interleave" and "exchange_every" not in train:
        return data
    train = dict(train)
    every = train.pop("exchange_every", None)
    if train.get("parameters") == "interleave":
        train["parameters"] = "shared"
        train.pop("replicas", None)
    elif every is not None:
        train.setdefault("n_push", every)
        train.setdefault("n_fetch", every)
    return {**data, "train": train}


def _build_section(name: str, table: Mapping[str, Any], origin: str):
    cls = SECTION_TYPES[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)}; "
            f"known keys of [{name}]: {', '.join(fields)}"
        )
    values = {}
    for key, value in table.items():
        if name == "model" and key == "layers":
            values[key] = _build_layers(value, origin)
        elif name == "model" and key == "input":
            values[key] = _build_input(value, origin)
        elif (name, key) in (
            ("ps", "servers"),
            ("data", "servers"),
            ("cluster", "group_servers"),
            ("model", "partition_hosts"),
        ):
            values[key] = _build_addresses(f"{name}.{key}", value, origin)
        else:
            default = getattr(cls(), key)
            values[key] = _coerce(f"{name}.{key}", value, type(default), origin)
    return cls(**values)


def _build_input(value: Any, origin: str) -> tuple[int, int, int]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(
            f"{origin}: model.input must be [channels, height, width] of positive integers, "
            f"got {value!r}"
        )
    return (value[0], value[1], value[2])


def _build_addresses(key: str, value: Any, origin: str) -> tuple[str, ...]:
    """A list of ``HOST:PORT`` strings, or one string of them separated by commas."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{origin}: {key} must be a list of HOST:PORT strings, got {value!r}")
    for address in value:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{origin}: {key}: {address!r} is not HOST:PORT (a port in 1..65535)")
    return tuple(value)


def _build_layers(value: Any, origin: str) -> tuple[LayerConfig, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{origin}: model.layers must be a non-empty list of tables")
    layers = []
    for index, table in enumerate(value):
        where = f"{origin}: model.layers[{index}]"
        if not isinstance(table, Mapping) or "type" not in table:
            raise ConfigError(f"{where} must be a table with a 'type' key, got {table!r}")
        kind = table["type"]
        if kind not in LAYER_KEYS:
            raise ConfigError(
                f"{where}: unknown layer type {kind!r}; known: {', '.join(LAYER_KEYS)}"
            )
        keys = LAYER_KEYS[kind]
        unknown = sorted(set(table) - set(keys) - {"type"})
        if unknown:
            raise ConfigError(
                f"{where} ({kind}): unknown key(s) {', '.join(unknown)}; "
                f"a {kind} layer takes: {', '.join(keys) or 'no keys'}"
            )
        values: dict[str, Any] = {"type": kind}
        for key, default in keys.items():
            if key in table:
                expected = float if key == "p" else int
                if key == "padding":  # a name, or PyTorch's zeros on every side
                    expected = int if isinstance(table[key], int) else str
                values[key] = _coerce(f"{kind}.{key}", table[key], expected, where)
            elif default is None and not (kind in POOLS and key == "stride"):
                raise ConfigError(f"{where} ({kind}): missing required key {key!r}")
            elif default is not None:
                values[key] = default
        if kind in POOLS and "stride" not in table:
            values["stride"] = values["size"]
        layers.append(LayerConfig(**values))
    return tuple(layers)


def _coerce(key: str, value: Any, expected: type, origin: str) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and isinstance(value, bool):
        return value
    if expected is not bool and isinstance(value, expected) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{origin}: {key} must be {expected.__name__}, got {value!r}")


def _parse_literal(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] not in SECTIONS:
        raise ConfigError(
            f"override {dotted!r}: expected section.key with a section among {', '.join(SECTIONS)}"
        )
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override {dotted!r}: no layer {part} (there are {len(node)})")
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node:
                raise ConfigError(
                    f"override {dotted!r}: unknown key {'.'.join(parts[: depth + 1])}"
                )
            node = node[part]
        else:
            raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:depth])} is not a table")
    if not isinstance(node, dict):
        raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:-1])} is not a table")
    # Unknown keys are left in place so that validation rejects them with the full list of keys.
    node[parts[-1]] = value
