"""jaxconv's native code: one C++ library, called from compiled JAX programs through XLA's FFI,
its build step and its loader. The oneDNN binding and Winograd sit side by side, on one
runtime:

* ``runtime/``: what every kernel shares: ``ffi_entry.cc`` (the FFI handlers: oneDNN's three
  kernels, Winograd's two, the matmul), ``team`` (the one thread that starts every OpenMP team),
  ``openmp`` (the OpenMP runtime oneDNN loaded, and ``OnTeam``, the one parallel loop),
  ``threading`` (chunks on XLA's pool), ``buffers`` (the one kind of working memory);
* ``onednn/``: the oneDNN binding, one file per concern, each opening with the rule it
  implements: ``problem`` (the problem and its cache key), ``descriptors`` (memory
  descriptors), ``decisions`` (the pure decisions: threading, the layout trial's pick, the
  filter-move plan), ``primitives`` (a primitive and its reorders), ``execute`` (running one),
  ``trial`` (the layout trial), ``cache`` (the primitive cache), ``filter_move``, ``taps`` (a
  data gradient as tap products, a trial candidate), ``matmul``,
  ``diagnostics`` (the C functions ``library`` calls) and ``decisions_diagnostics`` (the
  decisions' exports on plain numbers, for the tests);
* ``winograd/``: Winograd's minimal filtering (no oneDNN in it): ``winograd.h`` (the shape and
  the two entries), ``winograd_passes`` (the transforms per tile and ISA), ``winograd.cc`` (the
  drivers), ``winograd_product`` (the register-blocked products), ``winograd_tiles.h`` (per
  tile), ``winograd_decisions`` (the drivers' choices on plain numbers, tested directly) and
  ``winograd_diagnostics.cc``;
* ``build``: ``jaxconv build-onednn``, which compiles them against the ``onednn`` extra;
* ``library``: where the build goes, loading it once and registering its targets for the
  ``cpu`` platform, and what ``jaxconv check`` says about it.

The lowering methods that call it are ``lowering/onednn.py`` and ``lowering/winograd.py``.
"""
