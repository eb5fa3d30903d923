"""hogwild: Project Adam's lock-free multi-process training engine for CPUs.

The public Python API, the same engine the ``hogwild`` command runs::

    import hogwild
    config = hogwild.load_config()                 # the bundled Adam MNIST model
    config = config.override({"train.epochs": 2})
    result = hogwild.train(config, data="path/to/mnist")
    model = hogwild.load_checkpoint("checkpoints")
    labels = model.predict(images)

    model = hogwild.from_torch(net, (1, 28, 28))   # a torch.nn model, with its weights
    result = hogwild.train(model, epochs=2)
    hogwild.to_torch(result, net)                  # the trained weights, in place

Importing the package is cheap: numba and the engine load on first use.
"""

from hogwild import runtime as _runtime  # noqa: F401  (sets numba's environment first)

__version__ = "0.1.0"

__all__ = [
    "load_config",
    "train",
    "evaluate",
    "load_checkpoint",
    "from_torch",
    "to_torch",
    "__version__",
]


def load_config(path=None, overrides=None):
    """Load a job config (the bundled default when ``path`` is None) and apply overrides."""
    from hogwild.config import load_config as _load

    return _load(path, overrides)


def train(config=None, data=None, **options):
    """Train a model; see :func:`hogwild.training.api.train`."""
    from hogwild.training.api import train as _train

    return _train(config, data=data, **options)


def evaluate(checkpoint, data=None):
    """Evaluate a checkpoint on the test set; see :func:`hogwild.training.api.evaluate`."""
    from hogwild.training.api import evaluate as _evaluate

    return _evaluate(checkpoint, data=data)


def load_checkpoint(path):
    """A checkpoint as a model that predicts; see :class:`hogwild.training.api.TrainedModel`."""
    from hogwild.training.api import load_checkpoint as _load

    return _load(path)


def from_torch(module, input_shape, loss="cross_entropy"):
    """A PyTorch module as a model to train; see :mod:`hogwild.training.torch_bridge`."""
    from hogwild.training.torch_bridge import from_torch as _from_torch

    return _from_torch(module, input_shape, loss)


def to_torch(trained, module):
    """Load trained weights into a PyTorch module; see :mod:`hogwild.training.torch_bridge`."""
    from hogwild.training.torch_bridge import to_torch as _to_torch

    return _to_torch(trained, module)
