"""``fusegrad._blas``: OpenBLAS's kernel set chosen again on CPUs where its own choice is slow.

The rule is tested on CPU descriptions; the switch itself in fresh processes (the kernel set
is chosen when fusegrad is imported), where it must change the set the library reports, keep
products right, and leave a user's own ``OPENBLAS_CORETYPE`` alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fusegrad import _blas

ZEN4 = textwrap.dedent(
    """\
    processor\t: 0
    vendor_id\t: AuthenticAMD
    cpu family\t: 25
    model\t\t: 17
    flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512vl

    processor\t: 1
    vendor_id\t: GenuineIntel
    """
)
INTEL = ZEN4.replace("AuthenticAMD", "GenuineIntel").replace(": 25", ": 6")
ZEN3 = ZEN4.replace(" avx512f avx512bw avx512vl", "")


def test_cpu_description_reads_the_first_processor() -> None:
    cpu = _blas.cpu_description(ZEN4)
    assert cpu["vendor"] == "AuthenticAMD" and cpu["family"] == 25
    assert "avx512f" in cpu["flags"] and "sse2" in cpu["flags"]
    assert _blas.cpu_description("")["family"] == -1


@pytest.mark.parametrize(
    ("text", "current", "setting", "expected"),
    [
        (ZEN4, "SkylakeX", "auto", "Haswell"),
        (ZEN4, "Cooperlake", "auto", "Haswell"),
        (ZEN4, "Haswell", "auto", None),  # already the fast set
        (INTEL, "SkylakeX", "auto", None),  # full-width AVX-512: keep
        (ZEN3, "Zen", "auto", None),
        (ZEN4, "SkylakeX", "keep", None),
        (INTEL, "SkylakeX", "Haswell", "Haswell"),  # an explicit set always applies
        (INTEL, "Haswell", "haswell", None),
        (ZEN4, "", "auto", None),  # a library that cannot report its set
    ],
)
def test_preferred_kernels(text: str, current: str, setting: str, expected: str | None) -> None:
    assert _blas.preferred_kernels(_blas.cpu_description(text), current, setting) == expected


def test_auto_switches_only_numpys_own_openblas() -> None:
    cpu = _blas.cpu_description(ZEN4)
    assert _blas.preferred_kernels(cpu, "SkylakeX", "auto", numpys=False) is None
    assert _blas.preferred_kernels(cpu, "SkylakeX", "Haswell", numpys=False) == "Haswell"


_PROBE = textwrap.dedent(
    """\
    import json, numpy as np
    import fusegrad as fg
    from fusegrad import _blas
    rng = np.random.default_rng(0)
    a = rng.standard_normal((70, 130)).astype(np.float32)
    b = rng.standard_normal((130, 90)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs((fg.tensor(a) @ fg.tensor(b)).numpy() - exact).max())
    print(json.dumps({"sets": _blas.tune(), "err": err}))
    """
)


def _probe(**env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE",)}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _switchable() -> bool:
    return any(_blas._open(p) is not None for p in _blas._loaded_openblas())


needs_openblas = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _switchable(),
    reason="no OpenBLAS built with DYNAMIC_ARCH is loaded (numpy linked another BLAS)",
)


@needs_openblas
@pytest.mark.parametrize("target", ["Haswell", "Sandybridge"])
def test_a_set_named_in_the_setting_is_switched_to_and_products_stay_right(target: str) -> None:
    got = _probe(FUSEGRAD_BLAS_KERNELS=target)
    assert got["sets"] and all(s.lower() == target.lower() for s in got["sets"].values())
    assert got["err"] < 1e-3


@needs_openblas
def test_a_users_own_coretype_is_left_alone() -> None:
    got = _probe(OPENBLAS_CORETYPE="Sandybridge", FUSEGRAD_BLAS_KERNELS="Haswell")
    assert got["sets"] == {}  # fusegrad looked at nothing
    probe = textwrap.dedent(
        """\
        import json, fusegrad
        from fusegrad import _blas
        print(json.dumps([_blas._open(p)[1]().decode() for p in _blas._loaded_openblas()]))
        """
    )
    env = dict(os.environ, OPENBLAS_CORETYPE="Sandybridge", FUSEGRAD_BLAS_KERNELS="Haswell")
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert {s.lower() for s in json.loads(proc.stdout.strip().splitlines()[-1])} == {"sandybridge"}


@needs_openblas
def test_keep_leaves_openblas_own_choice() -> None:
    kept = _probe(FUSEGRAD_BLAS_KERNELS="keep")["sets"]
    native = _probe(FUSEGRAD_BLAS_KERNELS="auto")["sets"]
    assert kept.keys() == native.keys()
    cpu = _blas.cpu_description(_blas._cpuinfo())
    for path, kept_set in kept.items():
        numpys = os.sep + "numpy.libs" + os.sep in path
        want = _blas.preferred_kernels(cpu, kept_set, "auto", numpys) or kept_set
        assert native[path] == want
