"""oneDNN on CPU through XLA's FFI: the handler's source, its build step and its loader.

* ``handler.cc``: the FFI handlers of the three kernels (forward, data and weight gradient);
* ``build``: ``jaxconv build-onednn``, which compiles it against the ``onednn`` extra;
* ``library``: where the build goes, loading it once and registering its targets for the
  ``cpu`` platform, and what ``jaxconv check`` says about it.

The lowering method that calls it is ``lowering/onednn.py``.
"""
