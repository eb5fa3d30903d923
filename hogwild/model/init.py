"""Initial parameter values, written into the (shared) flat parameter vector by the parent.

``he``: normal with std ``sqrt(2 / fan_in)`` (for relu stacks); ``xavier``: uniform with bound
``sqrt(6 / (fan_in + fan_out))``; ``torch``: PyTorch's default for ``nn.Conv2d``/``nn.Linear``,
uniform with bound ``1 / sqrt(fan_in)`` for weights and biases alike. Biases start at zero except
under ``torch``. ``init_scale`` multiplies every weight's spread.
"""

import numpy as np

from hogwild.model.network import Network


def initialise(network: Network, params: np.ndarray, scheme: str, scale: float, seed: int) -> None:
    """Fill ``params`` (flat float32, the network's layout) deterministically from ``seed``."""
    rng = np.random.default_rng(seed)
    params[:] = 0.0
    views = network.views(params)
    for spec in network.params:
        view = views[spec.name]
        if scheme == "torch":
            bound = 1.0 / np.sqrt(spec.fan_in)
            view[...] = rng.uniform(-bound, bound, spec.shape) * (1.0 if spec.is_bias else scale)
        elif spec.is_bias:
            view[...] = 0.0
        elif scheme == "he":
            view[...] = rng.normal(0.0, scale * np.sqrt(2.0 / spec.fan_in), spec.shape)
        else:
            bound = scale * np.sqrt(6.0 / (spec.fan_in + spec.fan_out))
            view[...] = rng.uniform(-bound, bound, spec.shape)
