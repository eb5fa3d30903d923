"""PyTorch modules in and out: a ``torch.nn`` model as a hogwild model, trained weights back.

:func:`from_torch` reads a module's ``forward`` as the chain of layers it is (``torch.fx`` traces
it: an ``nn.Sequential``, or a module whose ``forward`` calls its layers and functions one after
the other), maps each layer to the engine's (:data:`SUPPORTED`), and keeps the module's current
weights under its own names. The engine ends every classifier in softmax with cross-entropy, so
the chain ends in the last ``Linear``'s logits, optionally followed by ``log_softmax`` or
``softmax`` over the classes (the same loss as ``nn.CrossEntropyLoss`` on logits, or
``nll_loss`` after ``log_softmax``); a regression (``loss="mse"``) ends in the last ``Linear``'s
values, trained with the mean squared error (``nn.MSELoss``).

A layer the engine cannot compute is refused with its position, its name and its settings, and
the list of what is supported: nothing is approximated.

:func:`to_torch` loads trained weights (a :class:`~hogwild.training.trainer.TrainResult`, or a
checkpoint's :class:`~hogwild.training.api.TrainedModel`) into the module in place with
``load_state_dict(strict=True)``.

torch is imported only when these functions run: the engine never needs it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hogwild.config import ModelConfig, config_from_dict
from hogwild.errors import ConfigError

SUPPORTED = (
    "Conv2d (square kernel and stride, integer or 'valid'/'same' zero padding, with bias)",
    "MaxPool2d and AvgPool2d (square window and stride, no padding)",
    "Flatten (from dimension 1)",
    "Linear (with bias)",
    "ReLU, Tanh, Sigmoid",
    "Dropout",
    "a final log_softmax / softmax / LogSoftmax / Softmax over the classes",
)


@dataclass(frozen=True)
class TorchModel:
    """A PyTorch module as the engine's model: the layer stack, the module's weights under the
    engine's names (``conv1.weight``, ``fc2.bias``, ...) and the module's name for each."""

    model: ModelConfig
    weights: dict[str, np.ndarray]  # engine name -> the module's current values
    names: dict[str, str]  # engine name -> the module's state_dict key
    source: str = ""  # the module's class, for messages
    n_classes: int = 0  # units of the last Linear (classes, or a regression's values)
    layers: tuple[str, ...] = field(default=())  # the chain as read, one line a layer

    def summary(self) -> str:
        return "\n".join(self.layers)


def _unsupported(position: int, what: str, detail: str = "") -> ConfigError:
    listing = "; ".join(SUPPORTED)
    reason = f": {detail}" if detail else ""
    return ConfigError(
        f"from_torch: layer {position} ({what}) is not supported{reason}. "
        f"hogwild supports: {listing}"
    )


def _square(value: Any, position: int, what: str, key: str) -> int:
    if isinstance(value, int):
        return value
    values = tuple(value)
    if len(values) == 2 and values[0] == values[1]:
        return int(values[0])
    raise _unsupported(position, what, f"{key}={value!r} is not square")


LOSSES = ("cross_entropy", "mse")


def from_torch(module: Any, input_shape, loss: str = "cross_entropy") -> TorchModel:
    """The engine's model for ``module`` (a ``torch.nn.Module``), with its current weights.

    Args:
        module: an ``nn.Sequential``, or a module whose ``forward`` is a plain chain of the
            layers in :data:`SUPPORTED` (as ``torch.fx`` traces it), ending in the logits of a
            ``Linear`` (a final ``log_softmax`` or ``softmax`` is taken as the cross-entropy the
            engine trains with).
        input_shape: one example's shape without the batch dimension: ``(channels, height,
            width)`` for images, ``(features,)`` for vectors.
        loss: ``"cross_entropy"`` (classes: the last Linear's logits) or ``"mse"`` (regression:
            the last Linear's values against targets, ``nn.MSELoss``; no final softmax).

    Raises:
        ConfigError: a layer is not supported (its position, name and settings, and what is),
            the chain is not plain, or the shapes do not fit.
    """
    import torch
    from torch import fx, nn

    if loss not in LOSSES:
        raise ConfigError(f"from_torch: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if not isinstance(module, nn.Module):
        raise ConfigError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 1:
        shape = (1, 1, shape[0])
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(
            "from_torch: input_shape must be (channels, height, width) or (features,), without "
            f"the batch dimension; got {tuple(input_shape)}"
        )
    source = type(module).__name__
    try:
        graph = fx.symbolic_trace(module).graph
    except Exception as exc:  # fx raises many kinds on control flow it cannot follow
        raise ConfigError(
            f"from_torch: the forward of {source} is not a plain chain of layers that torch.fx "
            f"can trace ({type(exc).__name__}: {exc}); write it as an nn.Sequential"
        ) from None
    modules = dict(module.named_modules())
    layers: list[dict] = []
    described: list[str] = []
    torch_names: list[str] = []  # per weighted layer, in order: the module's qualified name
    used: set[str] = set()
    current = None  # the node the chain has reached
    ended = False
    position = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            if current is not None:
                raise ConfigError(f"from_torch: {source}.forward takes more than one input")
            current = node
            continue
        if node.op == "output":
            if node.args[0] is not current:
                raise ConfigError(
                    f"from_torch: {source}.forward does not return the end of its chain"
                )
            break
        if node.op == "get_attr":
            raise _unsupported(position, f"a direct use of {node.target!r}")
        inputs = [a for a in _flat_args(node) if isinstance(a, fx.Node)]
        if inputs != [current]:
            raise ConfigError(
                f"from_torch: layer {position} ({node.format_node()}) does not take the output "
                f"of the layer before it alone: {source}.forward is not a plain chain"
            )
        if ended:
            raise _unsupported(
                position, _describe(node, modules), "only a final softmax may follow the output"
            )
        if node.op == "call_module":
            if node.target in used:
                raise _unsupported(
                    position, f"{node.target!r} again", "a module used twice shares its weights"
                )
            used.add(node.target)
            entry, ends = _module_layer(modules[node.target], node.target, position, nn)
        else:
            entry, ends = _function_layer(node, position, torch, nn)
        if ends and loss == "mse":
            raise _unsupported(
                position, _describe(node, modules), "a regression (loss='mse') ends in a Linear"
            )
        if ends:
            ended = True
        elif entry is not None:
            layers.append(entry)
            described.append(f"{position}: {_describe(node, modules)} -> {entry['type']}")
            if entry["type"] in ("conv", "fc"):
                torch_names.append(str(node.target))
        current = node
        position += 1
    if not layers or layers[-1]["type"] != "fc":
        last = described[-1] if described else "nothing"
        raise ConfigError(
            f"from_torch: {source} must end in a Linear layer's class scores (optionally then "
            f"log_softmax or softmax); its chain ends in {last}"
        )
    layers.append({"type": "mse" if loss == "mse" else "softmax"})
    try:
        model = config_from_dict({"model": {"input": list(shape), "layers": layers}}).model
    except ConfigError as exc:
        raise ConfigError(f"from_torch: {source}: {exc}") from None
    from hogwild.model.network import build_network

    n_classes = int(layers[-2]["units"])
    network = build_network(model, n_classes)  # the shapes fit, or the layer is named
    names, weights = {}, {}
    weighted = [layer for layer in network.layers if layer.config.type in ("conv", "fc")]
    state = module.state_dict()
    for layer, torch_name in zip(weighted, torch_names, strict=True):
        for kind in ("weight", "bias"):
            ours, theirs = f"{layer.name}.{kind}", f"{torch_name}.{kind}"
            value = state[theirs].detach().cpu().numpy().astype(np.float32)
            expected = network.param(ours).shape
            if value.shape != expected:
                raise ConfigError(
                    f"from_torch: {theirs} has shape {tuple(value.shape)}, the layer needs "
                    f"{expected} for an input of shape {layer.in_shape}"
                )
            names[ours], weights[ours] = theirs, value.copy()
    extra = sorted(set(state) - set(names.values()))
    if extra:
        raise ConfigError(
            f"from_torch: {source} holds state no layer of its forward uses: {', '.join(extra)} "
            "(the trained weights could not be loaded back with strict=True)"
        )
    return TorchModel(model, weights, names, source, n_classes, tuple(described))


def _flat_args(node) -> list:
    out = []
    for arg in list(node.args) + list(node.kwargs.values()):
        if isinstance(arg, list | tuple):
            out.extend(arg)
        else:
            out.append(arg)
    return out


def _describe(node, modules: dict) -> str:
    if node.op == "call_module":
        return f"{type(modules[node.target]).__name__} {node.target!r}"
    name = getattr(node.target, "__name__", str(node.target))
    return f"{name}()"


def _module_layer(layer, name: str, position: int, nn) -> tuple[dict | None, bool]:
    """(the engine's layer, whether it is a final softmax) for a module; refuses the rest."""
    what = f"{type(layer).__name__} {name!r}"
    if isinstance(layer, nn.Conv2d) and type(layer) is nn.Conv2d:
        if layer.groups != 1 or _square(layer.dilation, position, what, "dilation") != 1:
            raise _unsupported(position, what, "groups and dilation must be 1")
        if layer.padding_mode != "zeros":
            raise _unsupported(position, what, f"padding_mode={layer.padding_mode!r}")
        if layer.bias is None:
            raise _unsupported(position, what, "bias=False (the engine's layers have a bias)")
        padding = layer.padding
        if not isinstance(padding, str):
            padding = _square(padding, position, what, "padding")
        kernel = _square(layer.kernel_size, position, what, "kernel_size")
        if padding == "same" and kernel % 2 == 0:
            raise _unsupported(position, what, "padding='same' with an even kernel")
        stride = _square(layer.stride, position, what, "stride")
        if padding == "same" and stride != 1:
            raise _unsupported(position, what, "padding='same' with stride > 1")
        return {
            "type": "conv",
            "maps": layer.out_channels,
            "kernel": kernel,
            "stride": stride,
            "padding": padding,
        }, False
    if isinstance(layer, nn.MaxPool2d | nn.AvgPool2d):
        if _square(layer.padding, position, what, "padding") != 0 or layer.ceil_mode:
            raise _unsupported(position, what, "padding and ceil_mode must be off")
        if isinstance(layer, nn.MaxPool2d):
            if _square(layer.dilation, position, what, "dilation") != 1:
                raise _unsupported(position, what, "dilation must be 1")
            if layer.return_indices:
                raise _unsupported(position, what, "return_indices=True")
        elif layer.divisor_override is not None:
            raise _unsupported(position, what, "divisor_override")
        size = _square(layer.kernel_size, position, what, "kernel_size")
        stride = _square(layer.stride if layer.stride else size, position, what, "stride")
        kind = "maxpool" if isinstance(layer, nn.MaxPool2d) else "avgpool"
        return {"type": kind, "size": size, "stride": stride}, False
    if type(layer) is nn.Linear:
        if layer.bias is None:
            raise _unsupported(position, what, "bias=False (the engine's layers have a bias)")
        return {"type": "fc", "units": layer.out_features}, False
    if type(layer) is nn.Flatten:
        if layer.start_dim != 1 or layer.end_dim != -1:
            raise _unsupported(position, what, "only Flatten(start_dim=1, end_dim=-1)")
        return None, False
    for kind, cls in (("relu", nn.ReLU), ("tanh", nn.Tanh), ("sigmoid", nn.Sigmoid)):
        if type(layer) is cls:
            return {"type": kind}, False
    if type(layer) is nn.Dropout:
        return {"type": "dropout", "p": float(layer.p)}, False
    if type(layer) in (nn.LogSoftmax, nn.Softmax) and layer.dim in (1, -1):
        return None, True
    raise _unsupported(position, what)


def _function_layer(node, position: int, torch, nn) -> tuple[dict | None, bool]:
    """(the engine's layer, whether it is a final softmax) for a function or method call."""
    F = nn.functional
    target = node.target
    kwargs = dict(node.kwargs)
    args = list(node.args[1:])
    name = getattr(target, "__name__", str(target))
    what = f"{name}()"
    if target in (F.relu, torch.relu, "relu"):
        return {"type": "relu"}, False
    if target in (torch.tanh, F.tanh, "tanh"):
        return {"type": "tanh"}, False
    if target in (torch.sigmoid, F.sigmoid, "sigmoid"):
        return {"type": "sigmoid"}, False
    if target in (F.dropout, torch.dropout):
        p = kwargs.get("p", args[0] if args else 0.5)
        return {"type": "dropout", "p": float(p)}, False
    if target in (torch.flatten, "flatten"):
        start = kwargs.get("start_dim", args[0] if args else 0)
        end = kwargs.get("end_dim", args[1] if len(args) > 1 else -1)
        if start != 1 or end != -1:
            raise _unsupported(position, what, "only flatten(x, 1)")
        return None, False
    if target in ("view", "reshape") and len(args) == 2 and args[0] == -1:
        return None, False  # x.view(-1, n): flattening, checked against the Linear's shape
    if target in (F.max_pool2d, F.avg_pool2d, F.max_pool2d_with_indices):
        size = kwargs.get("kernel_size", args[0] if args else None)
        stride = kwargs.get("stride", args[1] if len(args) > 1 else None)
        padding = kwargs.get("padding", args[2] if len(args) > 2 else 0)
        if padding not in (0, (0, 0)) or kwargs.get("ceil_mode", False):
            raise _unsupported(position, what, "padding and ceil_mode must be off")
        size = _square(size, position, what, "kernel_size")
        stride = _square(stride if stride else size, position, what, "stride")
        kind = "avgpool" if target is F.avg_pool2d else "maxpool"
        return {"type": kind, "size": size, "stride": stride}, False
    if target in (F.log_softmax, F.softmax, torch.log_softmax, torch.softmax):
        dim = kwargs.get("dim", args[0] if args else None)
        if dim in (1, -1):
            return None, True
    if target is operator.getitem:
        raise _unsupported(position, "indexing", "the chain must pass whole tensors")
    raise _unsupported(position, what)


def load_module(spec: str) -> Any:
    """The module ``FUNCTION()`` returns, for ``spec`` = ``"FILE.py:FUNCTION"`` (the CLI's
    ``--model``). The file is run as a module of its own (its ``__main__`` block does not run).

    Raises:
        ConfigError: the spec, the file or the function is missing, or it returns no module.
    """
    import importlib.util
    from pathlib import Path

    from torch import nn

    path, _, function = spec.rpartition(":")
    if not path or not function:
        raise ConfigError(f"--model {spec!r}: expected FILE.py:FUNCTION, e.g. model.py:build")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--model {spec!r}: no file {file}")
    loader = importlib.util.spec_from_file_location(f"hogwild_user_model_{file.stem}", file)
    if loader is None or loader.loader is None:
        raise ConfigError(f"--model {spec!r}: {file} cannot be imported as Python")
    code = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(code)
    build = getattr(code, function, None)
    if not callable(build):
        raise ConfigError(f"--model {spec!r}: {file} defines no function {function!r}")
    module = build()
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"--model {spec!r}: {function}() returned {type(module).__name__}, not a "
            "torch.nn.Module"
        )
    return module


def state_dict_of(weights: dict[str, np.ndarray], names: dict[str, str]) -> dict[str, np.ndarray]:
    """``weights`` (under the engine's names) under the module's names where ``names`` has them."""
    return {names.get(name, name): value for name, value in weights.items()}


def to_torch(trained: Any, module: Any) -> Any:
    """Load ``trained``'s weights into ``module`` in place (``load_state_dict(strict=True)``).

    ``trained``: what :func:`hogwild.train` returned, or a checkpoint loaded with
    :func:`hogwild.load_checkpoint` (whose names are the engine's: ``conv1.weight``, ...).
    Returns the module.

    Raises:
        ConfigError: ``trained`` has no weights; RuntimeError (torch's): the names or shapes
            differ from the module's.
    """
    import torch

    state = trained.state_dict()
    if not state:
        raise ConfigError(f"to_torch: {type(trained).__name__} holds no trained weights")
    current = module.state_dict()
    tensors = {}
    for name, value in state.items():
        like = current.get(name)
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        tensors[name] = tensor.to(like.dtype) if like is not None else tensor
    module.load_state_dict(tensors, strict=True)
    return module
