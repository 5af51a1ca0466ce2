"""Code generation: the per-primitive lowering table (``lowering``), the numba CPU emitter
(``numba_cpu``) and fast vectorisable float32 math helpers (``fastmath``)."""
