"""Code generation: the per-primitive lowering table (``lowering``), what both emitters share
(``common``: kernel geometry, scalar expressions, the on-disk module cache), the numba CPU emitter
(``numba_cpu``) with its vectorisable float32 math helpers (``fastmath``, ``cpu_helpers``), the
precompiled interpreter for small kernels (``interpreter``) and the numba-cuda emitter and
launcher (``numba_cuda``)."""
