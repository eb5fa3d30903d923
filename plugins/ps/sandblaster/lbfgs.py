"""Sandblaster's L-BFGS coordinator: the optimizer, through shard operations and scalars only.

DistBelief section 4.2: "the core of the optimization algorithm (e.g. L-BFGS) resides in a
coordinator process, which does not have direct access to the model parameters. Instead, the
coordinator issues commands drawn from a small set of operations (e.g., dot product, scaling,
coefficient-wise addition, multiplication) that can be performed by each parameter server shard
independently, with the results being stored locally on the same shard. Additional information,
e.g. the history cache for L-BFGS, is also stored on the parameter server shard on which it was
computed." :class:`SandblasterLBFGS` is that coordinator: every vector of the algorithm is a
named vector on the shards (:class:`~.vectors.VectorOps`), and what it holds itself are
scalars: the loss, the step, ``g.d``, the history's ``rho_i = 1 / (y_i . s_i)`` and the
two-loop's ``alpha_i``.

The algorithm is Nocedal & Wright's L-BFGS (Algorithm 7.4, the two-loop recursion, with
``H0 = (s.y / y.y) I`` from the newest pair) arranged step for step as ``torch.optim.LBFGS``
arranges it, so that with a fixed step the two take the same steps:

1. At iteration ``k > 1``, ``y = g - g_prev`` and ``s = t_prev * d_prev`` are formed in a spare
   history slot; the pair joins the history (dropping the oldest beyond ``history``) only when
   ``y.s > curvature_eps``, as torch does, since nothing else here guarantees positive curvature.
2. ``d = -H g`` by the two-loop recursion, in place in ``"lbfgs.d"`` (the first iteration:
   ``d = -g``).
3. A step ``t`` along ``d``: the first iteration tries torch's ``min(1, 1/||g||_1) * lr`` (the
   L1 norm from the shards' ``asum``), later ones ``lr``.

**Line search.** DistBelief states no rule: section 4.2 names L-BFGS and the shard operations,
and the appendix text kept in shared/papers describes only the decomposition into scalar-vector
and inner products (the copy there does not hold the Algorithm 7.2 listing). Each trial point
costs a whole batch pass over every replica, so we use **backtracking with the Armijo
condition** (``line_search="armijo"``), a rule DistBelief leaves open: accept ``t`` when
``f(x + t d) <= f(x) + c1 t g.d``, else ``t *= backtrack``. It needs only the loss at each trial
(a scalar the replicas report); the gradient at the accepted point comes from the same pass, and
L-BFGS's unit step is accepted in most iterations, so an iteration almost always costs one
batch. A Wolfe search would also guarantee ``y.s > 0`` but may need extra trials (its zoom
phase) when a step is too short; here pairs with ``y.s <= curvature_eps`` are skipped instead
(step 1). ``line_search="none"`` takes the step as it is, as ``torch.optim.LBFGS`` does with
``line_search_fn=None``: the tests compare that with PyTorch (to float32 rounding).

**Mini-batch L-BFGS** (Ngiam et al., "On optimization methods for deep learning", ICML 2011:
L-BFGS on large mini-batches, a few iterations each, trains MNIST's convolutional nets faster
than the full batch does). :meth:`SandblasterLBFGS.new_batch` tells the coordinator that the
objective changed (another batch of examples): the next iteration evaluates the point afresh on
the new batch and forms no pair across the change (its ``y`` would be the difference of two
batches' gradients, not curvature), but the history of pairs measured within earlier batches is
kept, so the new batch starts from a quasi-Newton direction and the unit step rather than from
steepest descent's tiny first step.

**Stopping tests**, torch's, in torch's order, from the shards' reductions: before the first
iteration, ``max |g| <= tolerance_grad``; after each, ``max |g| <= tolerance_grad`` (``amax``),
``|t| max |d| <= tolerance_change`` (torch's ``max |t d|``), or ``|f_k - f_{k-1}| <
tolerance_change``; and no iteration moves when ``g.d > -tolerance_change``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from hogwild_plugins.ps.sandblaster.vectors import VectorOps

from hogwild.errors import HogwildError

__all__ = ["GRAD", "PARAMS", "Iteration", "LBFGSOptions", "SandblasterLBFGS"]

PARAMS = "params"
GRAD = "grad"


@dataclass(frozen=True)
class LBFGSOptions:
    """L-BFGS settings.

    Attributes:
        history: Pairs ``(s_i, y_i)`` kept (m).
        line_search: ``"armijo"`` (backtracking) or ``"none"`` (take the step as it is).
        lr: The step tried first (``"armijo"``) or taken (``"none"``) from iteration 2 on (the
            first iteration's is ``min(1, 1/||g||_1) * lr``, as torch's).
        c1: Armijo's sufficient-decrease constant.
        backtrack: Factor applied to a rejected step (0 < backtrack < 1).
        max_backtracks: Rejected trials before the search gives up (the iteration fails).
        curvature_eps: A pair joins the history only when ``y.s`` exceeds this (torch: 1e-10).
        tolerance_grad: Converged when ``max |g|`` is at most this.
        tolerance_change: Converged when the step's ``max |t d|`` is at most this, the loss
            changes by less than this, or ``g.d`` is above ``-tolerance_change`` (no descent left
            along ``d``).
    """

    history: int = 10
    line_search: str = "armijo"
    lr: float = 1.0
    c1: float = 1e-4
    backtrack: float = 0.5
    max_backtracks: int = 20
    curvature_eps: float = 1e-10
    tolerance_grad: float = 1e-7
    tolerance_change: float = 1e-9

    def __post_init__(self) -> None:
        if self.line_search not in ("armijo", "none"):
            raise HogwildError(f"line_search {self.line_search!r}: expected 'armijo' or 'none'")
        if self.history < 1 or not 0.0 < self.backtrack < 1.0 or not 0.0 < self.c1 < 1.0:
            raise HogwildError(
                f"L-BFGS needs history >= 1 (got {self.history}), 0 < backtrack < 1 "
                f"(got {self.backtrack}) and 0 < c1 < 1 (got {self.c1})"
            )


@dataclass(frozen=True)
class Iteration:
    """One iteration, in scalars.

    Attributes:
        k: Its number (1 for the first).
        loss: The loss at the point it ends on.
        step: The step ``t`` taken along ``d`` (0 when it stopped before moving).
        gtd: ``g.d`` at the point it started from.
        evaluations: Batch passes it used (trial points).
        pairs: History pairs after it.
        stop: Why the run should stop here (None: go on).
    """

    k: int
    loss: float
    step: float
    gtd: float
    evaluations: int
    pairs: int
    stop: str | None = None


class SandblasterLBFGS:
    """L-BFGS whose vectors all live on the shards.

    Args:
        vectors: The shard operations (a :class:`~hogwild_plugins.ps.client.PSClient`, or
            :class:`~.vectors.LocalVectors`).
        evaluate: One batch pass at the parameters ``"params"``: returns the loss and leaves the
            gradient in ``"grad"`` (see :class:`~.batch.BatchObjective`).
        options: :class:`LBFGSOptions`.
        prefix: Prefix of the coordinator's own vector names.
    """

    def __init__(
        self,
        vectors: VectorOps,
        evaluate: Callable[[], float],
        options: LBFGSOptions | None = None,
        prefix: str = "lbfgs.",
    ) -> None:
        self.v, self.evaluate = vectors, evaluate
        self.o = options or LBFGSOptions()
        self.d, self.g_prev, self.x0 = prefix + "d", prefix + "g_prev", prefix + "x0"
        self._slots = [(f"{prefix}s{i}", f"{prefix}y{i}") for i in range(self.o.history + 1)]
        self._spare = list(range(self.o.history, -1, -1))  # slot numbers, popped from the end
        self.history: deque[tuple[int, float]] = deque()  # (slot, rho), oldest first
        self.h_diag = 1.0
        self.t_prev = 0.0
        self.k = 0
        self.loss: float | None = None
        self.evaluations = 0
        self._pair_spans_batches = False  # the next pair would mix two batches' gradients

    def new_batch(self) -> None:
        """The objective changed: evaluate afresh, keep the history, form no pair across."""
        self.loss = None
        self._pair_spans_batches = self.k > 0

    def start(self) -> float:
        """Evaluate the starting point (once; :meth:`step` calls it if needed)."""
        self.loss = self._evaluate()
        return self.loss

    def _evaluate(self) -> float:
        self.evaluations += 1
        return float(self.evaluate())

    def run(self, iterations: int) -> list[Iteration]:
        """Up to ``iterations`` iterations, fewer if one says stop."""
        done = []
        for _ in range(iterations):
            done.append(self.step())
            if done[-1].stop:
                break
        return done

    def step(self) -> Iteration:
        """One L-BFGS iteration: update the history, find ``d``, search along it."""
        v, o = self.v, self.o
        if self.loss is None:
            self.start()
        self.k += 1
        f0 = self.loss
        if self.k == 1 and v.amax(GRAD) <= o.tolerance_grad:
            return Iteration(self.k, f0, 0.0, 0.0, 0, 0, "gradient max-abs at most tolerance_grad")
        if self.k > 1 and not self._pair_spans_batches:
            self._add_pair()
        self._pair_spans_batches = False
        self._direction()
        v.copy(GRAD, self.g_prev)
        if self.k == 1:
            t = min(1.0, 1.0 / max(v.asum(GRAD), 1e-300)) * o.lr
        else:
            t = o.lr
        gtd = v.dot(GRAD, self.d)
        if not gtd <= -o.tolerance_change:
            return Iteration(self.k, f0, 0.0, gtd, 0, len(self.history), "no descent along d")
        if o.line_search == "armijo":
            v.copy(PARAMS, self.x0)
        v.axpy(t, self.d, PARAMS)
        f, trials = self._evaluate(), 1
        while o.line_search == "armijo" and not f <= f0 + o.c1 * t * gtd:
            if trials > o.max_backtracks:
                return self._give_up(f0, gtd, trials)
            t *= o.backtrack
            v.copy(self.x0, PARAMS)
            v.axpy(t, self.d, PARAMS)
            f, trials = self._evaluate(), trials + 1
        self.t_prev, self.loss = t, f
        stop = None
        if v.amax(GRAD) <= o.tolerance_grad:
            stop = "gradient max-abs at most tolerance_grad"
        elif abs(t) * v.amax(self.d) <= o.tolerance_change:
            stop = "step max-abs at most tolerance_change"
        elif abs(f - f0) < o.tolerance_change:
            stop = "loss changed less than tolerance_change"
        return Iteration(self.k, f, t, gtd, trials, len(self.history), stop)

    def _add_pair(self) -> None:
        """``y = g - g_prev``, ``s = t_prev d_prev`` into a spare slot; kept if ``y.s`` > eps."""
        v = self.v
        slot = self._spare[-1]
        s, y = self._slots[slot]
        v.copy(GRAD, y)
        v.axpy(-1.0, self.g_prev, y)
        v.copy(self.d, s)
        v.scale(self.t_prev, s)
        ys = v.dot(y, s)
        if ys > self.o.curvature_eps:
            self._spare.pop()
            if len(self.history) == self.o.history:
                self._spare.append(self.history.popleft()[0])
            self.history.append((slot, 1.0 / ys))
            self.h_diag = ys / v.dot(y, y)

    def _direction(self) -> None:
        """``d = -H g`` by the two-loop recursion (``-g`` at the first iteration)."""
        v, d = self.v, self.d
        v.copy(GRAD, d)
        v.scale(-1.0, d)
        if self.k == 1:
            return
        alphas = []
        for slot, rho in reversed(self.history):
            s, y = self._slots[slot]
            alpha = v.dot(s, d) * rho
            v.axpy(-alpha, y, d)
            alphas.append(alpha)
        v.scale(self.h_diag, d)
        for (slot, rho), alpha in zip(self.history, reversed(alphas), strict=True):
            s, y = self._slots[slot]
            beta = v.dot(y, d) * rho
            v.axpy(alpha - beta, s, d)

    def _give_up(self, f0: float, gtd: float, trials: int) -> Iteration:
        """The search found no acceptable step: back to the start point, history cleared."""
        v = self.v
        v.copy(self.x0, PARAMS)
        v.copy(self.g_prev, GRAD)
        self._spare.extend(slot for slot, _ in self.history)
        self.history.clear()
        self.h_diag = 1.0
        why = f"line search: no sufficient decrease in {trials} trials"
        return Iteration(self.k, f0, 0.0, gtd, trials, 0, why)
