"""Normalised index keys: the ``key`` attribute of ``getitem``, ``index_put`` and
``index_add_at``.

``ops.indexing`` turns a Python key into a hashable *spec*, a tuple of tagged entries:
``("s", start, stop, step)`` slices, ``("i", n)`` ints, ``("n",)`` None, ``("e",)`` Ellipsis and
``("t", k)`` the k-th index tensor (the index tensors are the primitive's trailing inputs).
``numpy_key`` rebuilds the numpy key from a spec and the index arrays.  It sits at the bottom of
the package because the kernels of both devices use it: the CPU ones (``ops.primitives``) and the
CUDA ones (``cuda.ops``), which sit below the op surface.
"""

from __future__ import annotations


def numpy_key(spec: tuple, idx: tuple) -> tuple:
    """Rebuild a numpy index from a normalised key spec and the index arrays it refers to."""
    key: list = []
    for entry in spec:
        tag = entry[0]
        if tag == "s":
            key.append(slice(entry[1], entry[2], entry[3]))
        elif tag == "i":
            key.append(entry[1])
        elif tag == "t":
            key.append(idx[entry[1]])
        elif tag == "n":
            key.append(None)
        else:
            key.append(Ellipsis)
    return tuple(key)
