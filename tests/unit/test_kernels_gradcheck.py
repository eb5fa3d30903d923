"""Finite-difference checks of the model kernels the jobs run (float32), in float64.

Proves that :func:`hogwild.model.passes.backward` returns the gradient of the loss
(cross-entropy of the softmax output) that :func:`hogwild.model.passes.forward` computes: for
small networks covering every layer type and option (convolution with valid and same padding,
stride 1 and 2, kernel 3 and 5, one and several input and output maps; max-pooling 2/2 and 3/2;
fully connected; relu, tanh, sigmoid; dropout in training mode with a fixed kernel seed; softmax
with cross-entropy), the engine's forward output is the float64 numpy reference's
(:mod:`tests.unit.numpy_network`, which shares no code with the kernels), and every parameter's
gradient and the gradient with respect to the input agree with the float64 central differences
of that reference's loss, at the same parameters and input. Also proves that parameter gradients
accumulate over examples and do not depend on whether the input gradient is asked for, and that a
minibatch's backward pass (whose direct convolution weight gradients run after the per-example
passes, over groups of examples) adds the sum of its examples' one-example gradients.

The engine runs in float32, the only float type a job runs (parameters, activations and
gradients are float32 everywhere in the product), so these checks run the kernels the jobs
compile (tests.warm_kernels compiles them) and compile nothing of their own; the oracle is
exact to about 1e-9 (central differences of a float64 loss, step 1e-6), so what the tolerances
allow is the engine's float32 rounding (see ``assert_gradient_close``).
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import config_from_dict
from hogwild.model.network import COL_FUSED_RELU, COL_NEED_DIN, COL_OUT, Network, build_network
from hogwild.model.passes import FC_ACCUMULATE, backward, backward_batch, forward, forward_batch
from hogwild.model.random import seed_kernels
from tests.unit import numpy_network

# it runs the jobs' float32 passes, which tests.warm_kernels compiles: it runs once they are cached
pytestmark = pytest.mark.warmed_kernels

EPS = 1e-6  # the central differences' step (float64: truncation ~1e-12, rounding ~1e-10)
GRAD_TOL = 1e-5  # float32 rounding, as a share of a tensor's largest gradient (see below)
PROB_TOL = 1e-6  # float32 rounding of probabilities (at most 1)
DROPOUT_SEED = 1234


def conv(maps, kernel, stride=1, padding="valid"):
    return {"type": "conv", "maps": maps, "kernel": kernel, "stride": stride, "padding": padding}


def pool(size, stride):
    return {"type": "maxpool", "size": size, "stride": stride}


def fc(units):
    return {"type": "fc", "units": units}


def act(kind):
    return {"type": kind}


def dropout(p):
    return {"type": "dropout", "p": p}


SOFTMAX = {"type": "softmax"}

# Each network: (input shape, layers). Together they cover every layer type and option.
NETWORKS = {
    # valid k3 s1 with 2 -> 3 maps, relu, pool 2/2, fc, tanh
    "conv_valid_k3_s1-pool2-fc-tanh": (
        [2, 10, 10],
        [conv(3, 3), act("relu"), pool(2, 2), fc(6), act("tanh"), fc(10), SOFTMAX],
    ),
    # same k5 s2 with 3 -> 4 maps, sigmoid, pool 3/2
    "conv_same_k5_s2-sigmoid-pool3": (
        [3, 9, 9],
        [conv(4, 5, 2, "same"), act("sigmoid"), pool(3, 2), fc(10), SOFTMAX],
    ),
    # same k5 s1, then valid k3 s2, tanh, dropout before the classifier
    "conv_same_k5_s1-conv_valid_k3_s2-dropout": (
        [2, 8, 8],
        [
            conv(3, 5, 1, "same"),
            act("relu"),
            conv(2, 3, 2, "valid"),
            act("tanh"),
            dropout(0.3),
            fc(10),
            SOFTMAX,
        ],
    ),
    # one input map, same k3 s1, pool 3/2, fc-relu-dropout-fc
    "conv_same_k3_s1-pool3-fc-relu-dropout": (
        [1, 7, 7],
        [
            conv(2, 3, 1, "same"),
            act("relu"),
            pool(3, 2),
            fc(8),
            act("relu"),
            dropout(0.5),
            fc(10),
            SOFTMAX,
        ],
    ),
    # valid k5 s2, then same k3 s2 (strided path with padding), sigmoid
    "conv_valid_k5_s2-conv_same_k3_s2": (
        [2, 11, 11],
        [conv(3, 5, 2, "valid"), conv(2, 3, 2, "same"), act("sigmoid"), fc(10), SOFTMAX],
    ),
    # two stacked stride-1 convolutions computed directly, odd map counts (3, 5), partial vectors
    "conv_valid_k3-conv_valid_k5-odd_maps": (
        [2, 12, 12],
        [conv(3, 3), conv(5, 5), act("relu"), pool(2, 2), fc(10), SOFTMAX],
    ),
    # an activation and dropout as the very first layers (input gradient through them)
    "sigmoid-dropout-fc-relu-fc": (
        [1, 3, 4],
        [act("sigmoid"), dropout(0.25), fc(6), act("relu"), fc(10), SOFTMAX],
    ),
    # a pool as the first layer, then two stacked activations
    "pool2-fc-tanh-relu": (
        [2, 6, 6],
        [pool(2, 2), fc(7), act("tanh"), act("relu"), fc(10), SOFTMAX],
    ),
}


def make_network(input_shape, layers) -> Network:
    config = config_from_dict({"model": {"input": input_shape, "layers": layers}})
    return build_network(config.model)


class Problem:
    """One network with float32 parameters, an input and a label, evaluated by the engine (float32)
    and by the float64 numpy reference at the same values."""

    def __init__(self, network: Network, seed: int, need_input_grad: bool = True):
        rng = np.random.default_rng(seed)
        self.network = network
        self.ops = network.ops.copy()
        if need_input_grad:
            self.ops[0, COL_NEED_DIN] = 1
        self.params = np.zeros(network.n_params, dtype=np.float32)
        for spec in network.params:
            values = rng.normal(0.0, np.sqrt(1.5 / spec.fan_in), spec.size)
            self.params[spec.offset : spec.offset + spec.size] = values
        self.x = rng.normal(0.0, 1.0, network.input_size).astype(np.float32)
        self.label = int(rng.integers(0, network.n_classes))
        self.a = np.zeros(network.act_size, dtype=np.float32)
        self.da = np.zeros(network.act_size, dtype=np.float32)
        self.aux = np.zeros(network.act_size, dtype=np.int32)
        self.scratch = np.zeros(network.scratch_size, dtype=np.float32)
        self.out = int(network.ops[-1, COL_OUT])

    def run_forward(self, params: np.ndarray, x: np.ndarray) -> None:
        self.a[:] = 0.0
        self.a[: self.network.input_size] = x
        seed_kernels(DROPOUT_SEED)  # the same dropout mask on every forward pass
        forward(self.ops, params, self.a, self.aux, self.scratch, True)

    def probabilities(self) -> np.ndarray:
        """The engine's softmax output for this problem's example."""
        self.run_forward(self.params, self.x)
        return self.a[self.out : self.out + self.network.n_classes].copy()

    def masks(self) -> dict:
        """The engine's dropout keep masks of this example, by dropout layer index (the
        reference multiplies by them)."""
        self.run_forward(self.params, self.x)
        masks = {}
        for layer in self.network.layers:
            if layer.config.type == "dropout":
                start = self.network.act_offsets[layer.index + 1]
                masks[layer.index] = self.aux[start : start + int(np.prod(layer.out_shape))].copy()
        return masks

    def analytic(self) -> tuple[np.ndarray, np.ndarray]:
        """(parameter gradient, input gradient) from the engine's backward."""
        self.run_forward(self.params, self.x)
        grad = np.zeros_like(self.params)
        self.da[:] = 0.0
        backward(self.ops, self.params, self.a, self.da, self.aux, self.scratch, grad, self.label)
        return grad, self.da[: self.network.input_size].copy()

    def _reference_loss(self, params: np.ndarray, x: np.ndarray, masks: dict) -> float:
        return numpy_network.loss(self.network, params, x, self.label, masks)

    def numeric_params(self, indices: np.ndarray) -> np.ndarray:
        """Central differences of the reference's loss in the parameters at ``indices``."""
        masks = self.masks()
        x = self.x.astype(np.float64)
        p = self.params.astype(np.float64)
        out = np.empty(len(indices))
        for n, i in enumerate(indices):
            saved = p[i]
            p[i] = saved + EPS
            up = self._reference_loss(p, x, masks)
            p[i] = saved - EPS
            down = self._reference_loss(p, x, masks)
            p[i] = saved
            out[n] = (up - down) / (2 * EPS)
        return out

    def numeric_input(self) -> np.ndarray:
        """Central differences of the reference's loss in every input value."""
        masks = self.masks()
        p = self.params.astype(np.float64)
        x = self.x.astype(np.float64)
        out = np.empty(self.network.input_size)
        for i in range(len(x)):
            saved = x[i]
            x[i] = saved + EPS
            up = self._reference_loss(p, x, masks)
            x[i] = saved - EPS
            down = self._reference_loss(p, x, masks)
            x[i] = saved
            out[i] = (up - down) / (2 * EPS)
        return out


def param_indices(network: Network) -> np.ndarray:
    """Every parameter's index in the flat vector (alignment padding left out)."""
    return np.concatenate(
        [np.arange(spec.offset, spec.offset + spec.size) for spec in network.params]
    )


@pytest.fixture(scope="module", params=sorted(NETWORKS), ids=sorted(NETWORKS))
def problem(request) -> Problem:
    input_shape, layers = NETWORKS[request.param]
    return Problem(make_network(input_shape, layers), seed=len(request.param))


def assert_gradient_close(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    """The engine's float32 gradient ``got`` is the exact one, ``expected``, to float32 rounding.

    Each value the engine computes is a chain of float32 sums of products (a few hundred terms
    at most here), each rounded to within 2**-24 (6e-8) of its magnitude, so its error is a few
    ulps of the largest values its tensor's computation carries: on these networks at most
    4.4e-7 of the tensor's largest gradient magnitude (7 ulps), and ``GRAD_TOL`` allows 20 times
    that. A gradient that is wrong (a missing term, a wrong index, a wrong factor) is off by a
    share of its own size, far beyond that.
    """
    scale = float(np.abs(expected).max())
    assert scale > 1e-4, f"{what}: the gradient is (nearly) zero: the check would mean nothing"
    np.testing.assert_allclose(got, expected, rtol=0, atol=GRAD_TOL * scale, err_msg=what)


def test_the_forward_output_is_the_references(problem):
    """The engine's float32 softmax output is the float64 reference's (the loss the central
    differences differentiate is the engine's)."""
    expected = numpy_network.probabilities(
        problem.network,
        problem.params.astype(np.float64),
        problem.x.astype(np.float64),
        problem.masks(),
    )
    np.testing.assert_allclose(problem.probabilities(), expected, rtol=0, atol=PROB_TOL)


def test_parameter_gradients_match_central_differences(problem):
    grad, _ = problem.analytic()
    indices = param_indices(problem.network)
    numeric = problem.numeric_params(indices)
    for spec in problem.network.params:
        lo = np.searchsorted(indices, spec.offset)
        assert_gradient_close(
            grad[spec.offset : spec.offset + spec.size],
            numeric[lo : lo + spec.size],
            f"gradient of {spec.name}",
        )


def test_input_gradient_matches_central_differences(problem):
    _, dx = problem.analytic()
    assert_gradient_close(dx, problem.numeric_input(), "input gradient")


def test_padding_between_tensors_gets_no_gradient(problem):
    grad, _ = problem.analytic()
    mask = np.ones(problem.network.n_params, dtype=bool)
    mask[param_indices(problem.network)] = False
    assert not grad[mask].any()


@pytest.mark.parametrize("name", [n for n in sorted(NETWORKS) if "dropout" in n])
def test_dropout_mask_is_neither_empty_nor_full(name):
    """The dropout networks really drop some units and keep others (so the check means much)."""
    problem = Problem(make_network(*NETWORKS[name]), seed=len(name))
    problem.run_forward(problem.params, problem.x)
    for layer in problem.network.layers:
        if layer.config.type == "dropout":
            start = problem.network.act_offsets[layer.index + 1]
            mask = problem.aux[start : start + int(np.prod(layer.out_shape))]
            assert 0 < mask.sum() < len(mask)
            x_start = problem.network.act_offsets[layer.index]
            kept = problem.a[x_start : x_start + len(mask)] / (1.0 - layer.config.p)
            y = problem.a[start : start + len(mask)]
            np.testing.assert_allclose(y, np.where(mask == 1, kept, 0.0), rtol=1e-6)


def test_gradients_accumulate_and_do_not_depend_on_the_input_gradient(problem):
    """backward adds into grad (a minibatch sums); NEED_DIN of layer 0 only adds the input grad."""
    grad_once, _ = problem.analytic()
    without = Problem(problem.network, seed=0, need_input_grad=False)
    without.params, without.x, without.label = problem.params, problem.x, problem.label
    without.run_forward(without.params, without.x)
    grad = np.zeros_like(problem.params)
    for _ in range(2):
        backward(
            without.ops,
            without.params,
            without.a,
            without.da,
            without.aux,
            without.scratch,
            grad,
            without.label,
        )
    # the same float32 sums twice: equal to rounding (each pass's terms add into grad)
    np.testing.assert_allclose(grad, 2.0 * grad_once, rtol=1e-6, atol=1e-7 * np.abs(grad).max())


def test_dropout_in_evaluation_mode_is_the_identity():
    network = make_network([1, 3, 4], [dropout(0.5), fc(10), SOFTMAX])
    problem = Problem(network, seed=3)
    problem.a[: network.input_size] = problem.x
    forward(problem.ops, problem.params, problem.a, problem.aux, problem.scratch, False)
    start = network.act_offsets[1]
    np.testing.assert_array_equal(problem.a[start : start + network.input_size], problem.x)


def test_softmax_output_is_a_probability_vector(problem):
    problem.run_forward(problem.params, problem.x)
    probs = problem.a[problem.out : problem.out + problem.network.n_classes]
    assert (probs > 0).all()
    assert probs.sum() == pytest.approx(1.0, abs=1e-6)


def minibatch_passes(ops, network: Network, params, inputs, labels):
    """:func:`forward_batch`, then :func:`backward_batch` accumulating every gradient, over the
    rows of ``inputs``, dropout seeded as :meth:`Problem.run_forward` seeds it.

    Returns (the activations after the forward pass, the activations after the backward pass,
    their gradients, the parameter gradient).
    """
    n = len(inputs)
    act = np.zeros((n, network.act_size), dtype=params.dtype)
    act[:, : network.input_size] = inputs
    dact, aux = np.zeros_like(act), np.zeros(act.shape, dtype=np.int32)
    scratch = np.zeros(network.scratch_floats(n), dtype=params.dtype)
    grad = np.zeros_like(params)
    seed_kernels(DROPOUT_SEED)
    forward_batch(ops, params, act, aux, scratch, n, True)
    forwarded = act.copy()
    backward_batch(ops, params, act, dact, aux, scratch, grad, labels, n, FC_ACCUMULATE, 0.0, 1.0)
    return forwarded, act, dact, grad


@pytest.mark.parametrize(
    "name", ["conv_valid_k3-conv_valid_k5-odd_maps", "conv_valid_k3_s1-pool2-fc-tanh"]
)
def test_a_minibatch_gradient_is_the_sum_of_its_examples(name):
    input_shape, layers = NETWORKS[name]
    network = make_network(input_shape, layers)
    one = Problem(network, seed=7)
    n = 5
    rng = np.random.default_rng(3)
    inputs = rng.normal(0.0, 1.0, (n, network.input_size)).astype(np.float32)
    labels = rng.integers(0, network.n_classes, n).astype(np.int64)
    expected = np.zeros_like(one.params)
    for b in range(n):
        one.run_forward(one.params, inputs[b])
        backward(one.ops, one.params, one.a, one.da, one.aux, one.scratch, expected, int(labels[b]))
    before, act, _, grad = minibatch_passes(one.ops, network, one.params, inputs, labels)
    # the same products, summed in another order (over a group of examples): float32 rounding
    np.testing.assert_allclose(grad, expected, rtol=0, atol=GRAD_TOL * np.abs(expected).max())
    assert (act == before).all()  # the backward pass reads the activations, never writes them


FUSED = [
    name for name in sorted(NETWORKS) if make_network(*NETWORKS[name]).ops[:, COL_FUSED_RELU].any()
]


@pytest.mark.parametrize("name", FUSED)
def test_a_relu_fused_into_its_pool_computes_exactly_what_the_two_layers_do(name):
    """Same outputs, parameter gradients and input gradient, bit for bit, from the fused op table
    and the unfused one, over a minibatch whose inputs are small integers: most pool windows
    tie, and many hold only negative or zero values (where the relu cuts the gradient)."""
    input_shape, layers = NETWORKS[name]
    config = config_from_dict({"model": {"input": input_shape, "layers": layers}}).model
    nets = {fuse: build_network(config, fuse=fuse) for fuse in (True, False)}
    assert nets[True].act_size == nets[False].act_size
    network = nets[True]
    n = 6
    rng = np.random.default_rng(len(name))
    params = np.zeros(network.n_params, dtype=np.float32)
    for spec in network.params:
        values = rng.integers(-2, 3, spec.size) / 4.0
        params[spec.offset : spec.offset + spec.size] = values
    images = rng.integers(-2, 3, (n, network.input_size)).astype(np.float32)
    labels = rng.integers(0, network.n_classes, n).astype(np.int64)
    results = {}
    for fuse, net in nets.items():
        ops = net.ops.copy()
        ops[0, COL_NEED_DIN] = 1
        _, act, dact, grad = minibatch_passes(ops, net, params, images, labels)
        out = int(net.ops[-1, COL_OUT])
        results[fuse] = (act[:, out : out + 10], grad, dact[:, : net.input_size])
    for fused, unfused in zip(results[True], results[False], strict=True):
        np.testing.assert_array_equal(fused, unfused)
    assert np.abs(results[True][2]).max() > 0  # gradient reaches the input: not vacuous
