"""Op-table entries of ``fusegrad.special`` (imported by ``op_table.py``, which runs them like
its own: forward against scipy, float32, gradcheck, gradgradcheck, forward AD, PyTorch).

The references are scipy's; ``tests/test_special.py`` adds the tighter checks (PyTorch to
1e-10 in float64, high-precision references where scipy and PyTorch differ).  Bessel functions
of the first and second kind and Airy's Ai are not compared with PyTorch here: PyTorch 2.13's
are off by up to 1e-6 (its port of Cephes; scipy's agrees with mpmath to rounding).
"""

from __future__ import annotations

import scipy.special as sp
from op_table import S, add, binary, pos, promoted, unary, uni, with_special


def _range(lo: float, hi: float):  # type: ignore[no-untyped-def]
    return lambda rng, shape: uni(rng, shape, lo, hi)


# differentiable unary special functions: (name, scipy reference, domain of the samples)
for _name, _ref, _gen in [
    ("i0", sp.i0, _range(-4.0, 4.0)),
    ("i0e", sp.i0e, _range(-4.0, 4.0)),
    ("i1", sp.i1, _range(-4.0, 4.0)),
    ("i1e", sp.i1e, _range(-4.0, 4.0)),
    ("erfcx", sp.erfcx, _range(-3.0, 6.0)),
    ("ndtri", sp.ndtri, _range(0.02, 0.98)),
    ("log_ndtr", sp.log_ndtr, _range(-8.0, 5.0)),
    ("ndtr", sp.ndtr, _range(-5.0, 5.0)),
    ("entr", sp.entr, _range(0.1, 3.0)),
]:
    add(
        f"special.{_name}",
        lambda m, x, _n=_name: getattr(m.special, _n)(x),
        _ref,
        promoted(with_special(unary(_gen)), 1),
    )
# i0 also at top level and as a method, in place too
add("i0_", lambda m, x: (x * 1.0).i0_(), sp.i0, unary())

# not differentiable (PyTorch defines no derivative): outputs need no grad
for _name, _ref, _gen, _torch in [
    ("bessel_j0", sp.j0, _range(-20.0, 20.0), False),
    ("bessel_j1", sp.j1, _range(-20.0, 20.0), False),
    ("bessel_y0", sp.y0, _range(0.1, 20.0), False),
    ("bessel_y1", sp.y1, _range(0.1, 20.0), False),
    ("airy_ai", lambda x: sp.airy(x)[0], _range(-8.0, 5.0), False),
    ("modified_bessel_i0", sp.i0, _range(-5.0, 5.0), True),
    ("modified_bessel_i1", sp.i1, _range(-5.0, 5.0), True),
    ("modified_bessel_k0", sp.k0, _range(0.1, 5.0), True),
    ("modified_bessel_k1", sp.k1, _range(0.1, 5.0), True),
    ("scaled_modified_bessel_k0", sp.k0e, _range(0.1, 5.0), True),
    ("scaled_modified_bessel_k1", sp.k1e, _range(0.1, 5.0), True),
    ("spherical_bessel_j0", lambda x: sp.spherical_jn(0, x), _range(-6.0, 6.0), True),
]:
    add(
        f"special.{_name}",
        lambda m, x, _n=_name: getattr(m.special, _n)(x),
        _ref,
        promoted(with_special(unary(_gen)), 1) if _torch else unary(_gen),
        differentiable=False,
        torch=_torch,
    )

add(
    "special.polygamma",
    lambda m, x: (m.special.polygamma(2, x), m.polygamma(3, x)),
    lambda x: (sp.polygamma(2, x), sp.polygamma(3, x)),
    promoted(unary(pos), 1),
)
add(
    "special.xlog1py",
    lambda m, x, y: m.special.xlog1py(x, y),
    lambda x, y: sp.xlog1py(x, y),
    binary(uni, pos),
)
# incomplete gamma functions and zeta: differentiable in their second argument only
add(
    "special.gammainc",
    lambda m, a, x: (m.special.gammainc(a, x), m.special.gammaincc(a, x), a.igamma(x)),
    lambda a, x: (sp.gammainc(a, x), sp.gammaincc(a, x), sp.gammainc(a, x)),
    lambda rng: [
        S((pos(rng, (3, 4)), pos(rng, (3, 4)) * 2), nograd=frozenset({0})),
        S((pos(rng, (3, 1)), pos(rng, (4,))), nograd=frozenset({0})),
        S((pos(rng, (2, 3)), pos(rng, (2, 3))), nograd=frozenset({0}), noncontig=True),
    ],
)
add(
    "special.zeta",
    lambda m, x, q: m.special.zeta(x, q),
    sp.zeta,
    lambda rng: [
        S((uni(rng, (3, 4), 1.5, 4.0), pos(rng, (3, 4))), nograd=frozenset({0})),
        S((uni(rng, (3, 1), 1.5, 4.0), pos(rng, (4,))), nograd=frozenset({0})),
        S((uni(rng, (2, 3), 1.5, 4.0), 2.5), nograd=frozenset({0})),
    ],
)


def _polynomial_ref(name: str):  # type: ignore[no-untyped-def]
    """scipy's evaluation of the polynomial of degree ``n`` (an int)."""
    direct = {
        "chebyshev_polynomial_t": sp.eval_chebyt,
        "chebyshev_polynomial_u": sp.eval_chebyu,
        "hermite_polynomial_h": sp.eval_hermite,
        "hermite_polynomial_he": sp.eval_hermitenorm,
        "laguerre_polynomial_l": sp.eval_laguerre,
        "legendre_polynomial_p": sp.eval_legendre,
        "shifted_chebyshev_polynomial_t": lambda n, x: sp.eval_chebyt(n, 2 * x - 1),
        "shifted_chebyshev_polynomial_u": lambda n, x: sp.eval_chebyu(n, 2 * x - 1),
    }
    if name in direct:
        return lambda x, n: direct[name](n, x)
    # V_n and W_n through U: V_n(x) = U_n(x) - U_{n-1}(x), W_n(x) = U_n(x) + U_{n-1}(x)
    sign = -1.0 if name.endswith("_v") else 1.0
    shift = name.startswith("shifted")

    def ref(x, n):  # type: ignore[no-untyped-def]
        y = 2 * x - 1 if shift else x
        below = sp.eval_chebyu(n - 1, y) if n > 0 else 0.0
        return sp.eval_chebyu(n, y) + sign * below

    return ref


for _name in [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]:
    _lo = 0.0 if _name.startswith("shifted") else -1.0
    _ref = _polynomial_ref(_name)
    add(
        f"special.{_name}",
        lambda m, x, _n=_name: (
            getattr(m.special, _n)(x, 3),
            getattr(m.special, _n)(x, 11),
            getattr(m.special, _n)(x, 0),
        ),
        lambda x, _r=_ref: (_r(x, 3), _r(x, 11), _r(x, 0)),
        unary(_range(_lo, 1.0)),
        differentiable=False,
        # near the polynomials' zeros the recurrence and scipy's formulas differ in rounding
        f64_tol=(1e-9, 1e-11),
        f32_tol=(2e-5, 2e-5),
    )
