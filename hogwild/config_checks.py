"""Range and consistency checks of a built :class:`~hogwild.config.Config`.

Types and unknown keys are checked while the config is built (:mod:`hogwild.config`); this module
checks what a well-typed config can still get wrong: finite numbers, choices, ranges, and a layer
stack that ends in softmax. Each failure is a :class:`~hogwild.errors.ConfigError` that names the
key (or the layer) and what was expected.
"""

from __future__ import annotations

import dataclasses
import math

from hogwild.config import CHOICES, SECTION_TYPES, SECTIONS, Config
from hogwild.errors import ConfigError


def check_config(config: Config, origin: str) -> None:
    """Reject values out of range and combinations that cannot run, naming the key.

    Raises:
        ConfigError: The first problem found, prefixed with ``origin``.
    """

    def fail(msg: str) -> None:
        raise ConfigError(f"{origin}: {msg}")

    for section in SECTIONS:
        for f in dataclasses.fields(SECTION_TYPES[section]):
            value = getattr(getattr(config, section), f.name)
            if isinstance(value, float) and not math.isfinite(value):
                fail(f"{section}.{f.name} must be a finite number, got {value}")
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
            if layer.padding not in ("valid", "same"):
                fail(f"{where}: padding must be 'valid' or 'same', got {layer.padding!r}")
            if layer.padding == "same" and layer.kernel % 2 == 0:
                fail(
                    f"{where}: padding 'same' pads (kernel - 1) / 2 on every side and needs an "
                    f"odd kernel, got {layer.kernel}; use 'valid' or an odd kernel"
                )
        if layer.type == "maxpool" and (layer.size < 1 or layer.stride < 1):
            fail(f"{where}: size and stride must be >= 1")
        if layer.type == "fc" and layer.units < 1:
            fail(f"{where}: units must be >= 1")
        if layer.type == "dropout" and not 0.0 <= layer.p < 1.0:
            fail(f"{where}: p must be in [0, 1), got {layer.p}")
        if layer.type == "softmax" and index != len(layers) - 1:
            fail(f"{where}: softmax (with cross-entropy) must be the last layer")
    if layers[-1].type != "softmax":
        fail(f"the last layer must be softmax (with cross-entropy), got {layers[-1].type}")
    optim, train, out = config.optim, config.train, config.output
    if not optim.lr > 0:
        fail(f"optim.lr must be > 0, got {optim.lr}")
    if not 0.0 <= optim.momentum < 1.0:
        fail(f"optim.momentum must be in [0, 1), got {optim.momentum}")
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
    if train.epochs < 1 or train.batch < 1 or train.chunk < 1:
        fail("train.epochs, train.batch and train.chunk must be >= 1")
    if train.update_every < 0:
        fail(
            f"train.update_every must be >= 0 (0: chosen by the trainer), got {train.update_every}"
        )
    if train.exchange_every < 1:
        fail(f"train.exchange_every must be >= 1 (examples), got {train.exchange_every}")
    if train.workers < 0 or train.subset < 0:
        fail("train.workers and train.subset must be >= 0 (0 means: the default)")
    if not 0.0 < train.epoch_fraction <= 1.0:
        fail(f"train.epoch_fraction must be in (0, 1], got {train.epoch_fraction}")
    data = config.data
    if data.std <= 0:
        fail(f"data.std must be > 0, got {data.std}")
    if data.ram_budget_mb < 0:
        fail(f"data.ram_budget_mb must be >= 0 (0 means: none), got {data.ram_budget_mb}")
    if data.prefetch_depth < 1:
        fail(f"data.prefetch_depth must be >= 1, got {data.prefetch_depth}")
    if data.augment.strip():
        from hogwild.data.augment import AugmentSpec  # numba: loaded only when augmenting

        try:
            AugmentSpec.parse(data.augment)
        except ValueError as exc:
            fail(f"data.augment = {data.augment!r}: {exc}")
    if out.keep_checkpoints < 1:
        fail(f"output.keep_checkpoints must be >= 1, got {out.keep_checkpoints}")
