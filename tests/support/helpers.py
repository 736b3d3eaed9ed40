"""Shared test helpers: tolerance table, random data, layout conversions.

The conversions here are plain numpy transposes written independently of
``jaxconv._src.geometry``, so that the oracles do not share code with the
implementation under test.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv.testing

DATA = pathlib.Path(__file__).parents[1] / "data"

# Per-dtype tolerance for max|got - ref| / max(1, max|ref|), with the reference computed in
# float64 on the same (rounded) inputs (f32 at Precision.HIGHEST): the package's own table
# (jaxconv.testing), which the executed docs, notebooks and benchmarks read too.
TOLERANCE = jaxconv.testing.TOLERANCE
rel_error = jaxconv.testing.relative_error
check_grads = jaxconv.testing.check_grads


def bench_backend() -> str:
    """`jaxconv bench --backend` for the platform the suite runs on (JAX_PLATFORMS=cuda leaves
    JAX no CPU backend, and the runner's default is the CPU)."""
    return "cpu" if jax.default_backend() == "cpu" else "gpu"


LEVEL_0 = "--xla_backend_optimization_level=0"


def rerun_at_xla_default_level(request) -> bool:
    """Where this process compiles at XLA:CPU's optimisation level 0 (tests/conftest.py), runs
    the calling test in a child pytest at XLA's own level and asserts that it passed: True, and
    the caller returns. Elsewhere (already at the default level, or not on CPU) False: the
    caller runs its body here."""
    if LEVEL_0 not in os.environ.get("XLA_FLAGS", "").split():
        return False
    flags = " ".join(f for f in os.environ["XLA_FLAGS"].split() if f != LEVEL_0)
    env = dict(os.environ, XLA_FLAGS=flags, JAXCONV_TEST_XLA_OPT="default")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                          "no:cacheprovider", request.node.nodeid], capture_output=True,
                         text=True, env=env, cwd=pathlib.Path(__file__).parents[2], timeout=900)
    assert out.returncode == 0 and re.search(r"^1 passed", out.stdout, re.M), out.stdout[-4000:]
    return True


def load_vectors(name: str) -> dict:
    return json.loads((DATA / "vectors" / name).read_text())


def benchdnn_weights_shape(vectors: dict, op: str, fn) -> list[int]:
    """The weight-gradient shape that ``fn`` (a weight-gradient op of jaxconv's) infers for the
    benchdnn graph case of ``op`` in ``vectors``, and the case's own (``diff_weights``)."""
    case = next(c for c in vectors["benchdnn_graph_cases"] if c["op"] == op)
    a = case["attrs"]
    out = jax.eval_shape(
        lambda x, dy: fn(x, dy, a["weights_shape"], strides=a["strides"],
                         pads_begin=a["pads_begin"], pads_end=a["pads_end"],
                         dilations=a["dilations"], groups=a["groups"], auto_pad=a["auto_pad"],
                         data_format=a["data_format"], weights_format=a["weights_format"]),
        jax.ShapeDtypeStruct(case["src"], jnp.float32),
        jax.ShapeDtypeStruct(case["diff_dst"], jnp.float32))
    return [list(out.shape), case["diff_weights"]]


def assert_close(got, ref, dtype) -> None:
    """``got`` is within the bound of ``dtype`` (the precision it was computed in) of ``ref``."""
    jaxconv.testing.assert_close(got, ref, dtype)


def random(rng: np.random.Generator, shape, dtype=jnp.float32) -> jax.Array:
    """Standard-normal data rounded to ``dtype``."""
    return jnp.asarray(rng.standard_normal(shape), dtype)


def to_f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64) if np.dtype(
        a.dtype
    ).itemsize < 4 else np.asarray(a, np.float64)


# ---- layouts, independent of the library -----------------------------------


def data_to_ncx(a: np.ndarray, fmt: str) -> np.ndarray:
    return np.moveaxis(a, -1, 1) if fmt == "NXC" else a


def data_from_ncx(a: np.ndarray, fmt: str) -> np.ndarray:
    return np.moveaxis(a, 1, -1) if fmt == "NXC" else a


def conv_filter_to_oix(w: np.ndarray, fmt: str) -> np.ndarray:
    """Convolution filter XIO (*K, I, O) / OIX (O, I, *K) -> OIX."""
    if fmt == "OIX":
        return w
    n = w.ndim - 2
    return np.transpose(w, (n + 1, n, *range(n)))


def conv_filter_from_oix(w: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "OIX":
        return w
    n = w.ndim - 2
    return np.transpose(w, (*range(2, n + 2), 1, 0))


def conv_filter_shape(fmt: str, oc: int, icg: int, kernel) -> tuple[int, ...]:
    return (oc, icg, *kernel) if fmt == "OIX" else (*kernel, icg, oc)


def data_shape(fmt: str, n: int, c: int, spatial) -> tuple[int, ...]:
    return (n, c, *spatial) if fmt == "NCX" else (n, *spatial, c)


def same_pads(size, kernel, stride, dilation, upper: bool):
    """TF/ONNX SAME padding: the output is ceil(I / S)."""
    pb, pe = [], []
    for i, k, s, d in zip(size, kernel, stride, dilation):
        out = math.ceil(i / s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - i)
        lo = total // 2 if upper else total - total // 2
        pb.append(lo)
        pe.append(total - lo)
    return pb, pe


# ConvTranspose weights: I = IC (full), O = OC / groups.
_CONVT_AXES = {  # format -> position of (I, O) and where the spatial axes start
    "IOX": lambda n: ((0, 1), tuple(range(2, n + 2))),
    "OIX": lambda n: ((1, 0), tuple(range(2, n + 2))),
    "XOI": lambda n: ((n + 1, n), tuple(range(n))),
    "XIO": lambda n: ((n, n + 1), tuple(range(n))),
}


def convt_filter_to_iox(w: np.ndarray, fmt: str) -> np.ndarray:
    n = w.ndim - 2
    (i, o), sp = _CONVT_AXES[fmt](n)
    return np.transpose(w, (i, o, *sp))


def convt_filter_from_iox(w: np.ndarray, fmt: str) -> np.ndarray:
    n = w.ndim - 2
    (i, o), sp = _CONVT_AXES[fmt](n)
    perm = [0] * (n + 2)
    for src, dst in enumerate((i, o, *sp)):
        perm[dst] = src
    return np.transpose(w, perm)


def convt_filter_shape(fmt: str, ic: int, ocg: int, kernel) -> tuple[int, ...]:
    return convt_filter_from_iox(np.zeros((ic, ocg, *kernel)), fmt).shape


def deconv_same_pads(kernel, stride, dilation, upper: bool):
    """oneDNN ConvTranspose same_*: total = max(0, DK - S); same_upper puts the extra at the end."""
    pb, pe = [], []
    for k, s, d in zip(kernel, stride, dilation):
        total = max(0, (k - 1) * d + 1 - s)
        lo = total // 2 if upper else total - total // 2
        pb.append(lo)
        pe.append(total - lo)
    return pb, pe


def numpy_group_conv_transpose(x, w, strides, dilations, pads_begin, out_size):
    """A plain loop: full[n, g*Co+co, i*S + k*D] += x[n, g*Ci+ci, i] * w[g, ci, co, k],
    cropped at pads_begin to out_size (zeros past the end). Integer-exact in int64."""
    x = np.asarray(x)
    w = np.asarray(w)
    acc = np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64
    n_batch, _, *in_size = x.shape
    g, ci, co, *k = w.shape
    full_size = [s * (i - 1) + (kk - 1) * d + 1 for i, kk, s, d in
                 zip(in_size, k, strides, dilations)]
    full = np.zeros((n_batch, g * co, *full_size), acc)
    for gi in range(g):
        for idx in np.ndindex(*in_size):
            xin = x[(slice(None), slice(gi * ci, (gi + 1) * ci), *idx)].astype(acc)  # (N, Ci)
            for kidx in np.ndindex(*k):
                pos = tuple(i * s + kk * d for i, kk, s, d in zip(idx, kidx, strides, dilations))
                wk = w[(gi, slice(None), slice(None), *kidx)].astype(acc)  # (Ci, Co)
                full[(slice(None), slice(gi * co, (gi + 1) * co), *pos)] += xin @ wk
    out = np.zeros((n_batch, g * co, *out_size), acc)
    src, dst = [], []
    for b, o, f in zip(pads_begin, out_size, full_size):
        lo, hi = b, min(b + o, f)
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(0, max(0, hi - lo)))
    out[(slice(None), slice(None), *dst)] = full[(slice(None), slice(None), *src)]
    return out


def check_bad_input(thunk, exc, parts, ops_pattern) -> None:
    """``thunk()`` raises ``exc``; the message starts with an op name and holds ``parts``."""
    import re

    import pytest

    with pytest.raises(exc) as info:
        thunk()
    msg = str(info.value)
    assert re.match(ops_pattern, msg), f"message does not start with an op name: {msg!r}"
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


def onednn_weights_shape(case, groups=1):
    """A oneDNN shape case's weights; some write it as text, "[16, 32/groups, 3, 3] (...)"."""
    w = case["weights"]
    if isinstance(w, str):
        dims = w.split("]")[0].strip("[ ").split(",")
        w = [int(t.split("/")[0]) // (groups if "/groups" in t else 1) for t in dims]
    return tuple(w)


def equations(fn, *args) -> list:
    """Every equation of ``fn``'s jaxpr, inner jaxprs included (jaxconv_conv is opaque)."""
    import jax.extend

    def walk(jaxpr):
        out = []
        for eqn in jaxpr.eqns:
            out.append(eqn)
            if eqn.primitive.name != "jaxconv_conv":
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    out += walk(sub)
        return out
    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def lax_convolutions(fn, *args) -> int:
    """How many lax convolutions ``fn`` runs outside jaxconv's kernels."""
    return sum(e.primitive.name == "conv_general_dilated" for e in equations(fn, *args))


def negative_widths(fn, *args) -> list[str]:
    """The convolutions and pads of ``fn``'s lowered program (StableHLO) with a negative pad."""
    text = jax.jit(fn).lower(*args).as_text()
    bad = []
    for m in re.finditer(r"pad = \[\[([-\d, \[\]]*)\]\]", text):  # convolution's pad attribute
        if "-" in m.group(1):
            bad.append(m.group(0))
    for m in re.finditer(r"stablehlo\.pad[^\n]*low = \[([-\d, ]*)\], high = \[([-\d, ]*)\]",
                         text):
        if "-" in m.group(1) + m.group(2):
            bad.append(m.group(0))
    for m in re.finditer(r"padding = dense<([^>]*)>", text):  # convolution's generic form
        if "-" in m.group(1):
            bad.append(m.group(0))
    return bad
