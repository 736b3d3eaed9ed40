"""The ``jaxconv`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    """Computes a filter gradient with jaxconv and checks it against jax.vjp."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import jaxconv

    attrs = dict(strides=(2, 2), dilations=(1, 1), auto_pad="same_upper", groups=2,
                 data_format="NXC", filter_format="XIO", precision=lax.Precision.HIGHEST)
    rng = np.random.default_rng(args.seed)
    x = jnp.asarray(rng.standard_normal((8, 32, 32, 16)), jnp.float32)      # N, H, W, IC
    filter_shape = (3, 3, 16 // attrs["groups"], 32)                        # KH, KW, IC/g, OC
    y_shape = jax.eval_shape(
        lambda x: jaxconv.convolution(x, jnp.zeros(filter_shape), **attrs), x).shape
    dy = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)

    dw = jax.jit(lambda x, dy: jaxconv.convolution_backprop_filters(x, dy, filter_shape, **attrs))(x, dy)
    # The reference: jax.vjp of plain lax.conv_general_dilated ("SAME" is TF's
    # rule, the same as same_upper), independent of jaxconv's geometry.
    def plain(w):
        return lax.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=2, precision=lax.Precision.HIGHEST)
    _, vjp = jax.vjp(plain, jnp.zeros(filter_shape))
    (ref,) = vjp(dy)
    err = float(jnp.max(jnp.abs(dw - ref)) / jnp.max(jnp.abs(ref)))
    ok = err < 1e-5
    print("jaxconv demo: ConvolutionBackpropFilters-1 on", jax.default_backend().upper())
    print(f"  input_forward {tuple(x.shape)} NXC, output_delta {tuple(dy.shape)}, "
          f"filter_shape {filter_shape} XIO")
    print("  strides (2, 2), auto_pad same_upper, groups 2")
    print(f"  filter_delta[1, 1, :3, 0] = {np.asarray(dw[1, 1, :3, 0]).round(4).tolist()}")
    print(f"  max |jaxconv - jax.vjp| / max |jax.vjp| = {err:.2e}  (reference: jax.vjp of lax.conv_general_dilated) -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxconv", description="Differentiable convolution-gradient operators for JAX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="compute a filter gradient and check it against jax.vjp",
                          description=_demo.__doc__)
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)
