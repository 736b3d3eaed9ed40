"""An in-process A/B of a runtime setting of the handler (which threads run a call: it changes
no program and no value), shared by ``benchmarks/onednn_linger.py`` and
``benchmarks/winograd_pool.py``: the accelerated models' calls, and each side's timing
alternating with the others' in one process (a fresh random order each round, each side's
median of its rounds' medians)."""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv
from jaxconv._src import lax_refs
from jaxconv._src.bench import model_inference, model_steps, models
from jaxconv._src.native import library

#: a side of the A/B: a context inside which its calls run
Side = Callable[[], contextlib.AbstractContextManager[None]]


def forward(name: str, batch: int) -> Callable[[], Any]:
    """The model's accelerated inference-mode forward, its variables closed over (as served)."""
    shape = {"mnist_cnn": (batch, 28, 28, 1), "dcgan": (batch, 1, 1, 100)}.get(
        name, (batch, 224, 224, 3))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    v = jax.tree.map(jnp.asarray, model_inference.variables(name, x))
    model = model_inference._flax_model(name, None)
    f = jax.jit(jaxconv.accelerate(functools.partial(model.apply, v)))
    xj = jnp.asarray(x)
    return lambda: jax.block_until_ready(f(xj))


def step(name: str, batch: int) -> Callable[[], Any]:
    """One accelerated training step (BatchNorm where the model has it, SGD with momentum),
    carrying its state."""
    spec = models.MODELS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, spec.image, spec.image, spec.channels)).astype(np.float32)
    labels = rng.integers(0, spec.classes, batch).astype(np.int32)
    variables = models.init(name, jnp.asarray(x), True)
    model = models.build(name, lax_refs.conv_general_dilated, True)
    jitted, tx = model_steps._jax_step(model, True, donate=True, accelerate=True)
    run = model_steps._training_loop(jitted, variables["params"],
                                     variables.get("batch_stats", {}),
                                     tx.init(variables["params"]), jnp.asarray(x),
                                     jnp.asarray(labels))

    def once() -> Any:
        loss, state = run()
        return jax.block_until_ready(state)
    return once


def ab(call: Callable[[], Any], sides: dict[str, Side], rounds: int,
       per_round: int) -> dict[str, float]:
    """Each side's median ms (of its rounds' medians), sides alternating in a fresh order."""
    for _ in range(3):
        call()
    rng = np.random.default_rng(1)
    medians: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(rounds):
        for k in rng.permutation(list(sides)):
            with sides[str(k)]():
                call()  # the side's threads as its calls leave them
                ts = []
                for _ in range(per_round):
                    t = time.perf_counter()
                    call()
                    ts.append(time.perf_counter() - t)
            medians[str(k)].append(statistics.median(ts))
    return {k: statistics.median(v) * 1e3 for k, v in medians.items()}


def per_call(call: Callable[[], Any], stat: str, calls: int = 5, settle_s: float = 0.0) -> float:
    """How much the handler's counter ``stat`` (``library.cache_stats``) grows per call under
    the rule, after ``settle_s`` seconds idle and one call."""
    time.sleep(settle_s)
    call()
    before = library.cache_stats()[stat]
    for _ in range(calls):
        call()
    return (library.cache_stats()[stat] - before) / calls
