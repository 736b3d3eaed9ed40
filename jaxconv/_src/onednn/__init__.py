"""oneDNN on CPU through XLA's FFI: the handler's source, its build step and its loader.

* ``csrc/``: the FFI handler, one file per concern, each opening with the rule it implements:
  ``ffi_entry.cc`` (the three kernels' FFI handlers: forward, data and weight gradient),
  ``problem`` (the problem and its cache key), ``descriptors`` (oneDNN memory descriptors),
  ``decisions`` (the pure decisions: threading, the layout trial's pick, the filter-move plan),
  ``primitives`` (a primitive and its reorders), ``execute`` (running one; working memory),
  ``trial`` (the layout trial), ``cache`` (the primitive cache), ``threading`` (chunks on
  XLA's pool, the OpenMP team), ``openmp``, ``filter_move`` and ``diagnostics`` (the C
  functions ``library`` calls);
* ``build``: ``jaxconv build-onednn``, which compiles it against the ``onednn`` extra;
* ``library``: where the build goes, loading it once and registering its targets for the
  ``cpu`` platform, and what ``jaxconv check`` says about it.

The lowering method that calls it is ``lowering/onednn.py``.
"""
