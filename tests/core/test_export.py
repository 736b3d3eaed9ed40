"""``jax.export`` of functions that use jaxconv (docs/export.md).

By default an export holds the portable XLA formulations, whether or not oneDNN is built: the
artifact serializes, and a fresh process that never imports jaxconv deserializes and runs it
with the values jaxconv computes in this process. With the opt-in (``lowering="onednn"`` and
:func:`jaxconv.onednn_export_checks`) the artifact keeps oneDNN's call: a process without
jaxconv's handler gets XLA's error, one that registers it gets the values.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv._src.native import library
from tests.support import helpers as h

pytest.importorskip("flatbuffers", reason="jax.export's serialization needs flatbuffers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DN = ("NHWC", "HWIO", "NHWC")
ONEDNN = pytest.mark.skipif(not library.status().available,
                            reason="the onednn extra is not built")

# Problems large enough that lowering="auto" picks oneDNN on CPU where it is built (the
# jitted program holds its calls: the export's portability is then a decision, not a given).
_RNG = np.random.default_rng(0)
X = jnp.asarray(_RNG.standard_normal((4, 16, 16, 32)), jnp.float32)
W = jnp.asarray(_RNG.standard_normal((3, 3, 32, 32)), jnp.float32)
DY = jnp.asarray(_RNG.standard_normal((4, 16, 16, 32)), jnp.float32)
WG = jnp.asarray(_RNG.standard_normal((2, 16, 16, 3, 3)), jnp.float32)  # OpenVINO's G, C_IN, C_OUT


def _train_grads(w, x):  # jax.grad through the lax-signature entry point: all three kernels
    def loss(w, x):
        y = jaxconv.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)
        return (jax.nn.relu(y) ** 2).sum()
    return jax.grad(loss, argnums=(0, 1))(w, x)


FUNCTIONS = {
    "grad-of-conv_general_dilated": (_train_grads, (W, X)),
    "convolution_backprop_filters": (lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, W.shape, pads_begin=1, pads_end=1), (X, DY)),
    "group_convolution_backprop_data": (lambda dy, w: jaxconv.group_convolution_backprop_data(
        dy, w, pads_begin=(1, 1), pads_end=(1, 1)), (jnp.transpose(DY, (0, 3, 1, 2)), WG)),
    # its own primitives (no oneDNN call): their lowering, exported
    "grad-of-max_pool": (lambda x, dy: jax.vjp(lambda x: jaxconv.max_pool(
        x, 3, 2, ((1, 1), (1, 1))), x)[1](dy)[0], (X, DY[:, :8, :8])),
}

# The child: jax and numpy only; every artifact deserialized and run against its expected value.
CHILD = """
import sys, pathlib, numpy as np, jax
folder, tol = pathlib.Path(sys.argv[1]), float(sys.argv[2])
for blob in sorted(folder.glob("*.bin")):
    exported = jax.export.deserialize(bytearray(blob.read_bytes()))
    data = np.load(blob.with_suffix(".npz"))
    args = [data[f"arg{i}"] for i in range(len(data.files)) if f"arg{i}" in data.files]
    got = jax.tree_util.tree_leaves(exported.call(*args))
    want = [data[k] for k in sorted(k for k in data.files if k.startswith("out"))]
    for g, w in zip(got, want):
        err = float(np.max(np.abs(np.asarray(g) - w)) / max(1.0, float(np.max(np.abs(w)))))
        assert err <= tol, (blob.name, err)
    print("ran", blob.stem)
assert "jaxconv" not in sys.modules
"""


def _save(folder: pathlib.Path, name: str, exported: jax.export.Exported, args, outs) -> None:
    (folder / f"{name}.bin").write_bytes(exported.serialize())
    leaves = jax.tree_util.tree_leaves(outs)
    np.savez(folder / f"{name}.npz", **{f"arg{i}": np.asarray(a) for i, a in enumerate(args)},
             **{f"out{i}": np.asarray(o) for i, o in enumerate(leaves)})


def _child(code: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu", **env})


def test_export_is_portable_and_runs_in_a_process_without_jaxconv(tmp_path):
    for name, (fn, args) in FUNCTIONS.items():
        jitted = jax.jit(fn)
        if library.status().available and "max_pool" not in name:  # the handler's in process ...
            text = jitted.lower(*args).as_text()
            assert "jaxconv_onednn" in text or "jaxconv_winograd" in text, name
        # exact float32 in the artifact (a GPU's default, TF32, may round differently in
        # another process: its convolution algorithms are chosen per process)
        with jax.default_matmul_precision("float32"):
            exported = jax.export.export(jitted)(*args)
            want = jitted(*args)
        module = exported.mlir_module()  # ... the export's is not
        assert "jaxconv_onednn" not in module and "jaxconv_winograd" not in module, name
        _save(tmp_path, name, exported, args, want)
    # the child runs on the platform the export holds a program for (XLA's name, "cuda", as
    # JAX_PLATFORMS spells it: a device's own name, "gpu", would ask for ROCm too)
    (platform,) = exported.platforms
    out = _child(CHILD, str(tmp_path), str(h.TOLERANCE["float32"]), JAX_PLATFORMS=platform)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.count("ran ") == len(FUNCTIONS), out.stdout


def test_export_for_several_platforms():
    """An export for CPU and GPU at once (no device needed): each platform's formulation."""
    fn, args = FUNCTIONS["grad-of-conv_general_dilated"]
    exported = jax.export.export(jax.jit(fn), platforms=("cpu", "cuda"))(*args)
    assert exported.platforms == ("cpu", "cuda")
    assert "jaxconv_onednn" not in exported.mlir_module()
    got = exported.call(*args)  # runs here on CPU
    for g, w in zip(got, jax.jit(fn)(*args)):
        h.assert_close(g, w, jnp.float32)


OPT_IN = """
import sys, numpy as np, jax
if sys.argv[2] == "register":
    import jaxconv
    jaxconv.onednn_export_checks()
exported = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
data = np.load(sys.argv[1][:-4] + ".npz")
try:
    got = exported.call(data["arg0"], data["arg1"])
except Exception as e:
    print("error:", type(e).__name__, e)
    raise SystemExit(3)
err = float(np.max(np.abs(np.asarray(got) - data["out0"])) / np.max(np.abs(data["out0"])))
print("error", err)
assert err <= float(sys.argv[3])
"""


@ONEDNN
def test_opt_in_keeps_the_onednn_call(tmp_path):
    fn = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(
        x, dy, W.shape, pads_begin=1, pads_end=1, lowering="onednn"))
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
        jax.export.export(fn)(X, DY)  # JAX's own refusal, without the opt-in's checks
    exported = jax.export.export(fn, disabled_checks=jaxconv.onednn_export_checks())(X, DY)
    assert "jaxconv_onednn_weight" in exported.mlir_module()
    _save(tmp_path, "weight", exported, (X, DY), fn(X, DY))
    blob = str(tmp_path / "weight.bin")
    tol = str(h.TOLERANCE["float32"])
    bare = _child(OPT_IN, blob, "bare", tol)
    assert bare.returncode == 3, bare.stdout + bare.stderr[-2000:]
    assert "No FFI handler registered for jaxconv_onednn_weight" in bare.stdout, bare.stdout
    registered = _child(OPT_IN, blob, "register", tol)
    assert registered.returncode == 0, registered.stdout + registered.stderr[-2000:]


def test_opt_in_checks_refuse_where_onednn_is_off():
    code = ("import jaxconv\ntry:\n    jaxconv.onednn_export_checks()\nexcept RuntimeError as e:"
            "\n    print(e)\n")
    out = _child(code, JAXCONV_ONEDNN="0")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("onednn_export_checks: jaxconv's oneDNN handler is not "
                                 "available"), out.stdout
    assert "JAXCONV_ONEDNN=0" in out.stdout
