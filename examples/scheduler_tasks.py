"""Two tenants sharing the device through gpk.Scheduler: a guaranteed one with a fixed
memory reservation and a best-effort one; each result is checked against NumPy."""

from __future__ import annotations

import numpy as np

import pygpukit as gpk


@gpk.compile
def score(x: gpk.GPUArray, w: gpk.GPUArray) -> gpk.GPUArray:
    """softmax(x @ w) over the last axis."""
    return gpk.nn.softmax(x @ w, axis=-1)


def main() -> float:
    """Submit a few tasks per tenant; returns the largest difference from NumPy."""
    rng = np.random.default_rng(1)
    wn = rng.standard_normal((32, 16)).astype(np.float32)
    w = gpk.asarray(wn)
    inputs = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(6)]
    err = 0.0
    with gpk.Scheduler(memory=256 << 20) as scheduler:
        tasks = []
        for k, xn in enumerate(inputs):
            policy = "guaranteed" if k % 2 == 0 else "best_effort"
            memory = "16MB" if policy == "guaranteed" else None
            tasks.append((xn, scheduler.submit(score, gpk.asarray(xn), w, memory=memory,
                                               policy=policy, tenant=policy)))  # fmt: skip
        for xn, task in tasks:
            logits = xn.astype(np.float64) @ wn.astype(np.float64)
            e = np.exp(logits - logits.max(-1, keepdims=True))
            err = max(err, float(np.abs(task.result(60).to_numpy() - e / e.sum(-1,
                                        keepdims=True)).max()))  # fmt: skip
            st = scheduler.stats(task.id)
            print(
                f"task {st['id']}: {st['qos']:<11} reserved {st['reservation_bytes']} bytes, "
                f"{st['state']}"
            )
    print(f"max |error| vs float64 NumPy = {err:.2e}")
    return err


if __name__ == "__main__":
    main()
