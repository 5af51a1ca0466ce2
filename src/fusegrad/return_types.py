"""Named tuples of ops that return values and indices, as ``torch.return_types``.

``values, indices = fusegrad.sort(x)`` unpacks like a tuple; ``.values`` / ``.indices`` name the
parts, and the type's name is the op's (``fusegrad.return_types.topk``).  Below the op surface:
it needs nothing from fusegrad.
"""

from __future__ import annotations

from collections import namedtuple

topk = namedtuple("topk", ["values", "indices"])
sort = namedtuple("sort", ["values", "indices"])
kthvalue = namedtuple("kthvalue", ["values", "indices"])
median = namedtuple("median", ["values", "indices"])
cummax = namedtuple("cummax", ["values", "indices"])
cummin = namedtuple("cummin", ["values", "indices"])
mode = namedtuple("mode", ["values", "indices"])
aminmax = namedtuple("aminmax", ["min", "max"])
nanmedian = namedtuple("nanmedian", ["values", "indices"])
frexp = namedtuple("frexp", ["mantissa", "exponent"])
histogram = namedtuple("histogram", ["hist", "bin_edges"])
histogramdd = namedtuple("histogramdd", ["hist", "bin_edges"])
