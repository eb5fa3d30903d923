"""A Ray actor parameter server, Ray's documented pattern: a peer of Adam Fig. 9.

It stands beside ``bench/figures/adam_fig9_ps.py``.

Ray's parameter-server example keeps the weights in an actor with ``apply_gradients(*gradients)``
and ``get_weights()``; workers call ``ps.apply_gradients.remote(grad)`` and ``ray.get`` the
result. Here ``clients`` worker actors each push a float32 delta of ``floats`` values (1 MiB by
default) synchronously, one at a time, for ``seconds``, from a common start; the server adds each
into its float32 vector and returns a version number (a small acknowledgement, as ours does,
rather than the weights). An update is one parameter changed by one delta, as Adam counts.

Run: ``python bench/peers/ps_ray.py [--floats 262144] [--clients 2] [--seconds 3]``; prints one
JSON line ``{"updates_per_s", "pushes_per_s", "gb_s", "clients", "ray"}``. Ray runs on this
machine only (a local instance started and shut down here, no dashboard).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def measure(floats: int, clients: int, seconds: float, repeats: int = 1) -> dict:
    import ray

    ray.init(
        num_cpus=max(2, os.cpu_count() or 2),
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=True,
    )
    try:

        @ray.remote(num_cpus=0)
        class ParameterServer:
            def __init__(self, n: int) -> None:
                self.params = np.zeros(n, np.float32)
                self.version = 0

            def apply_gradients(self, *gradients) -> int:
                for gradient in gradients:
                    self.params += gradient
                self.version += 1
                return self.version

            def get_weights(self) -> np.ndarray:
                return self.params

        @ray.remote(num_cpus=0)
        class Worker:
            def run(self, ps, n: int, windows: list[tuple[float, float]]) -> list[int]:
                delta = np.ones(n, np.float32)
                for _ in range(5):  # warm-up
                    ray.get(ps.apply_gradients.remote(delta))
                counts = []
                for start, end in windows:
                    time.sleep(max(0.0, start - time.time()))
                    count = 0
                    while time.time() < end:
                        ray.get(ps.apply_gradients.remote(delta))
                        count += 1
                    counts.append(count)
                return counts

        ps = ParameterServer.remote(floats)
        workers = [Worker.remote() for _ in range(clients)]
        ray.get([w.__ray_ready__.remote() for w in workers])
        windows = _windows(time.time() + 3.0, seconds, repeats)
        counts = ray.get([w.run.remote(ps, floats, windows) for w in workers])
        assert float(ray.get(ps.get_weights.remote())[0]) > 0
    finally:
        ray.shutdown()
    per_window = [sum(c[i] for c in counts) / seconds for i in range(repeats)]
    pushes = statistics.median(per_window)
    return {
        "updates_per_s": pushes * floats,
        "pushes_per_s": pushes,
        "gb_s": pushes * floats * 4 / 1e9,
        "clients": clients,
        "windows_pushes_per_s": per_window,
        "ray": ray.__version__,
    }


def _windows(start: float, seconds: float, repeats: int) -> list[tuple[float, float]]:
    """``repeats`` timed windows of ``seconds``, half a second apart, from ``start``."""
    return [
        (start + i * (seconds + 0.5), start + i * (seconds + 0.5) + seconds) for i in range(repeats)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floats", type=int, default=262_144)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=1, help="timed windows (their median)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.floats, args.clients, args.seconds, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
