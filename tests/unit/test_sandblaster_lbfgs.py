"""Sandblaster's L-BFGS coordinator (plugins/ps/sandblaster/lbfgs.py) on in-memory shard vectors.

The oracles: ``torch.optim.LBFGS`` with ``line_search_fn=None`` (a fixed step; its first step
``min(1, 1/||g||_1) * lr`` the coordinator computes from the shards' ``asum``), and
:func:`reference_lbfgs`, a plain float64 numpy L-BFGS of the same algorithm with Armijo
backtracking, itself checked against torch for the fixed step.
The problem is a convex one, L2-regularised softmax regression, where float32 shard vectors and
float64 references can agree to float tolerance over many iterations.

:class:`SoftmaxRegression` and :func:`reference_lbfgs` are shared with the cluster test
(tests/cluster/test_sandblaster.py), which runs the same comparison through parameter servers,
replicas and the engine's kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.sandblaster import LBFGSOptions, LocalVectors, SandblasterLBFGS

torch = pytest.importorskip("torch")


class SoftmaxRegression:
    """Mean cross-entropy of ``softmax(X W^T + b)`` plus ``0.5 * l2 * ||p||^2`` in float64.

    The parameter vector is laid out as the engine lays out one fully connected layer:
    ``W`` ([classes, features], row-major) at 0, ``b`` at ``bias``, ``n_params`` in all (the
    rest is alignment padding, zero, with zero gradient apart from L2's).
    """

    def __init__(self, X, labels, classes: int, l2: float, bias: int, n_params: int):
        self.X, self.labels, self.classes, self.l2 = X, np.asarray(labels), classes, l2
        self.bias, self.n_params = bias, n_params
        self.nw = classes * X.shape[1]

    def __call__(self, p: np.ndarray) -> tuple[float, np.ndarray]:
        p = np.asarray(p, np.float64)
        n = len(self.labels)
        w = p[: self.nw].reshape(self.classes, -1)
        z = self.X @ w.T + p[self.bias : self.bias + self.classes]
        z -= z.max(1, keepdims=True)
        prob = np.exp(z)
        prob /= prob.sum(1, keepdims=True)
        rows = np.arange(n)
        loss = -np.log(prob[rows, self.labels]).mean() + 0.5 * self.l2 * (p @ p)
        prob[rows, self.labels] -= 1.0
        grad = self.l2 * p
        grad[: self.nw] += (prob.T @ self.X).ravel() / n
        grad[self.bias : self.bias + self.classes] += prob.sum(0) / n
        return float(loss), grad

    def torch_steps(self, x0, iterations: int, *, history: int, lr: float) -> list[np.ndarray]:
        """The iterates of ``torch.optim.LBFGS(line_search_fn=None)`` from ``x0``, in float64."""
        x = torch.tensor(np.asarray(x0, np.float64), requires_grad=True)
        X = torch.tensor(self.X, dtype=torch.float64)
        y = torch.tensor(self.labels, dtype=torch.int64)
        seen = []

        def closure():
            opt.zero_grad()
            w = x[: self.nw].view(self.classes, -1)
            z = X @ w.T + x[self.bias : self.bias + self.classes]
            loss = torch.nn.functional.cross_entropy(z, y) + 0.5 * self.l2 * (x @ x)
            loss.backward()
            seen.append(x.detach().numpy().copy())
            return loss

        opt = torch.optim.LBFGS(
            [x], lr=lr, max_iter=iterations, max_eval=2 * iterations, history_size=history,
            tolerance_grad=-1.0, tolerance_change=0.0, line_search_fn=None,
        )  # fmt: skip
        opt.step(closure)
        assert len(seen) == iterations  # the closure runs at x_0 .. x_{K-1}
        return seen[1:] + [x.detach().numpy().copy()]


def two_loop(q: np.ndarray, pairs: list, h_diag: float) -> np.ndarray:
    """L-BFGS's two-loop recursion (Nocedal & Wright, Algorithm 7.4): ``q`` (the negative
    gradient) times the inverse-Hessian estimate the ``(s, y, 1/(y.s))`` pairs and ``h_diag``
    make."""
    alphas = []
    for s_i, y_i, rho in reversed(pairs):
        alphas.append((s_i @ q) * rho)
        q = q - alphas[-1] * y_i
    q = q * h_diag
    for (s_i, y_i, rho), alpha in zip(pairs, reversed(alphas), strict=True):
        q = q + (alpha - (y_i @ q) * rho) * s_i
    return q


def reference_lbfgs(fg, x0, iterations, *, history, lr, line_search, c1=1e-4, backtrack=0.5,
                    eps=1e-10):  # fmt: skip
    """Plain L-BFGS on float64 vectors, the algorithm of ``SandblasterLBFGS`` written out (the
    first step torch's ``min(1, 1/||g||_1) * lr``).

    Returns:
        (iterates x_1..x_K, losses, trials per iteration).
    """
    x = np.asarray(x0, np.float64)
    f, g = fg(x)
    pairs, h_diag, d, t, g_prev = [], 1.0, None, None, None
    xs, fs, trials = [], [], []
    for k in range(1, iterations + 1):
        q = -g
        if k > 1:
            y, s = g - g_prev, t * d
            ys = y @ s
            if ys > eps:
                pairs = (pairs + [(s, y, 1.0 / ys)])[-history:]
                h_diag = ys / (y @ y)
            q = two_loop(q, pairs, h_diag)
        d, g_prev, f0 = q, g, f
        t = min(1.0, 1.0 / np.abs(g).sum()) * lr if k == 1 else lr
        gtd = g @ d
        f, g = fg(x + t * d)
        n = 1
        while line_search == "armijo" and not f <= f0 + c1 * t * gtd:
            t *= backtrack
            f, g = fg(x + t * d)
            n += 1
        x = x + t * d
        xs.append(x)
        fs.append(f)
        trials.append(n)
    return xs, fs, trials


def problem(seed=0, n=300, features=20, classes=5, l2=1e-2, scale=3.0) -> SoftmaxRegression:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, features)) * scale
    labels = rng.integers(0, classes, n)
    X = centres[labels] + rng.standard_normal((n, features)) * scale
    nw = classes * features
    return SoftmaxRegression(X, labels, classes, l2, bias=nw, n_params=nw + classes + 3)


def coordinator(fg, x0, **options) -> tuple[SandblasterLBFGS, LocalVectors]:
    """A coordinator on in-memory shard vectors whose evaluate() runs ``fg`` on ``"params"``."""
    v = LocalVectors(x0)

    def evaluate() -> float:
        loss, grad = fg(v["params"])
        v["grad"][:] = grad
        return loss

    return SandblasterLBFGS(v, evaluate, LBFGSOptions(**options)), v


def close(a, b, rel=2e-5) -> bool:
    return float(np.abs(np.asarray(a, np.float64) - b).max()) <= rel * max(1.0, np.abs(b).max())


def test_the_reference_takes_torchs_steps_with_a_fixed_step():
    p = problem()
    x0 = np.zeros(p.n_params)
    want = p.torch_steps(x0, 15, history=4, lr=1.0)
    got, _, _ = reference_lbfgs(p, x0, 15, history=4, lr=1.0, line_search="none")
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert np.abs(a - b).max() <= 1e-9 * max(1.0, np.abs(b).max()), k


def test_fixed_step_coordinator_takes_torchs_steps():
    p = problem(seed=1)
    x0 = np.zeros(p.n_params, np.float32)
    want = p.torch_steps(x0, 15, history=4, lr=1.0)
    c, v = coordinator(p, x0, history=4, line_search="none", lr=1.0, tolerance_change=0.0)
    for k, b in enumerate(want, 1):
        it = c.step()
        assert it.k == k and it.evaluations == 1 and it.stop is None
        assert close(v["params"], b), (k, np.abs(v["params"] - b).max())
    assert len(c.history) == 4  # full, the oldest pairs dropped


def test_armijo_coordinator_matches_the_numpy_reference_and_backtracks():
    p = problem(seed=0, l2=1e-2)
    x0 = np.zeros(p.n_params, np.float32)
    opts = dict(history=3, lr=2.0)  # a unit step that overshoots now and then
    want, losses, trials = reference_lbfgs(p, x0, 12, line_search="armijo", **opts)
    assert max(trials) > 1  # the search did backtrack somewhere
    c, v = coordinator(p, x0, line_search="armijo", tolerance_change=0.0, **opts)
    for k, (b, loss, n) in enumerate(zip(want, losses, trials, strict=True), 1):
        it = c.step()
        assert it.evaluations == n, k
        assert it.loss == pytest.approx(loss, rel=1e-5)
        assert close(v["params"], b), (k, np.abs(v["params"] - b).max())
    assert c.evaluations == 1 + sum(trials)


def test_pairs_without_positive_curvature_are_skipped():
    slope = np.linspace(-1.0, 1.0, 10)

    def linear(x):  # constant gradient: y = 0, y.s = 0 every time
        return float(slope @ x), slope.copy()

    c, v = coordinator(linear, np.zeros(10, np.float32), line_search="none", tolerance_change=0.0)
    its = c.run(4)
    assert [it.pairs for it in its] == [0, 0, 0, 0]
    first = 1.0 / np.abs(slope).sum()  # torch's min(1, 1/||g||_1)
    assert np.allclose(v["params"], -slope * (first + 3 * 1.0), atol=1e-6)  # steepest descent


def test_a_search_that_finds_no_decrease_gives_up_where_it_started():
    def uphill(x):
        return (float("nan") if np.any(x) else 0.0), np.ones(4)  # NaN away from 0 is never taken

    c, v = coordinator(uphill, np.zeros(4, np.float32), max_backtracks=3)
    it = c.step()
    assert it.stop.startswith("line search") and it.evaluations == 4 and it.step == 0.0
    assert not v["params"].any() and (v["grad"] == 1).all()


def bowl(x) -> tuple[float, np.ndarray]:
    """``0.5 ||x||^2`` and its gradient ``x``."""
    x = np.asarray(x, np.float64)
    return 0.5 * float(x @ x), x.copy()


def test_convergence_stops_the_run():
    c, _ = coordinator(bowl, np.full(6, 3.0, np.float32))
    its = c.run(50)
    assert len(its) < 50 and its[-1].stop is not None and its[-1].loss < 1e-10
    c, v = coordinator(bowl, np.zeros(6, np.float32))
    it = c.step()  # already at the optimum: torch returns before its first iteration
    assert it.stop.startswith("gradient max-abs") and it.evaluations == 0 and not v["params"].any()


def test_torchs_stopping_tests_on_max_abs_reductions():
    x0 = np.array([3.0, -4.0, 0.5], np.float32)
    c, _ = coordinator(bowl, x0, tolerance_grad=3.99, tolerance_change=0.0)
    it = c.step()  # max |g| = 4 > 3.99 at the start: it moves, by t = 1/||g||_1 = 1/7.5
    assert it.evaluations == 1 and it.step == pytest.approx(1 / 7.5)
    assert it.stop.startswith("gradient max-abs")  # max |g| = 4 (1 - 1/7.5) = 3.47 <= 3.99
    c, _ = coordinator(bowl, x0, tolerance_grad=3.4, tolerance_change=0.54)
    assert c.step().stop.startswith("step max-abs")  # |t| max |d| = 4 / 7.5 = 0.533


def reference_minibatch_lbfgs(objectives, x0, per_batch, *, history, lr, line_search, c1=1e-4,
                              backtrack=0.5, eps=1e-10):  # fmt: skip
    """:func:`reference_lbfgs` over a sequence of objectives (mini-batches), ``per_batch``
    iterations on each: a new batch evaluates the point afresh, forms no pair across the change
    and keeps the pairs measured so far.

    Returns:
        (iterates, losses, pairs after each iteration, trials per iteration).
    """
    x = np.asarray(x0, np.float64)
    pairs, h_diag, d, t, g_prev, k = [], 1.0, None, None, None, 0
    xs, fs, kept, trials = [], [], [], []
    for fg in objectives:
        f, g = fg(x)
        across = k > 0
        for _ in range(per_batch):
            k += 1
            q = -g
            if k > 1:
                if not across:
                    y, s = g - g_prev, t * d
                    ys = y @ s
                    if ys > eps:
                        pairs = (pairs + [(s, y, 1.0 / ys)])[-history:]
                        h_diag = ys / (y @ y)
                q = two_loop(q, pairs, h_diag)
            across = False
            d, g_prev, f0 = q, g, f
            t = min(1.0, 1.0 / np.abs(g).sum()) * lr if k == 1 else lr
            gtd = g @ d
            f, g = fg(x + t * d)
            n = 1
            while line_search == "armijo" and not f <= f0 + c1 * t * gtd:
                t *= backtrack
                f, g = fg(x + t * d)
                n += 1
            x = x + t * d
            xs.append(x)
            fs.append(f)
            kept.append(len(pairs))
            trials.append(n)
    return xs, fs, kept, trials


def test_mini_batches_keep_the_history_and_form_no_pair_across_batches():
    """Three batches of one problem, four iterations each: the coordinator, told of each new
    batch, takes the reference's steps; the pairs carry over (the history is full by the third
    batch), while no pair mixes two batches' gradients."""
    whole = problem(seed=2, n=600)
    batches = [
        SoftmaxRegression(whole.X[i::3], whole.labels[i::3], whole.classes, whole.l2,
                          whole.bias, whole.n_params)
        for i in range(3)
    ]  # fmt: skip
    x0 = np.zeros(whole.n_params, np.float32)
    opts = dict(history=5, lr=1.0)
    want, losses, kept, trials = reference_minibatch_lbfgs(
        batches, x0, 4, line_search="armijo", **opts
    )
    assert kept[3] == 3 and kept[4] == 3 and kept[-1] == 5  # nothing formed across, then full
    current = [batches[0]]
    c, v = coordinator(lambda x: current[0](x), x0, line_search="armijo", tolerance_change=0.0,
                       **opts)  # fmt: skip
    steps = iter(zip(want, losses, kept, trials, strict=True))
    for number, batch in enumerate(batches):
        if number:
            current[0] = batch
            c.new_batch()
        for _ in range(4):
            b, loss, pairs, n = next(steps)
            it = c.step()
            assert (it.pairs, it.evaluations) == (pairs, n)
            assert it.loss == pytest.approx(loss, rel=1e-5)
            assert close(v["params"], b), (it.k, np.abs(v["params"] - b).max())
    assert c.evaluations == 3 + sum(trials)  # a fresh evaluation at the start of each batch
    # and it learns: the whole problem's loss fell well below its start
    assert whole(v["params"])[0] < 0.5 * whole(x0)[0]
