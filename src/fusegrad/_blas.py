"""OpenBLAS's kernel set, chosen again where its own choice is slow for this CPU.

Where this sits: below everything; ``fusegrad/__init__.py`` calls ``tune()`` once numpy is
loaded.  Only numpy's own OpenBLAS (the wheel's copy, under ``numpy.libs``) is switched by the
default rule: scipy's copy (an older OpenBLAS, which numba's ``np.dot`` calls) measured no
faster with the Haswell set, and slower on the LSTM-LM's per-step product (35 products of 20 x
200 by 800: 3.7 ms with its Skylake-X set, 4.8 with Haswell).  The recurrent kernels call
numpy's copy by name (``ops/recurrent_kernels.py``).

Why: numpy's and scipy's wheels ship OpenBLAS built for every x86 CPU (``DYNAMIC_ARCH``); it
picks its kernel set when it loads.  On AMD Zen 4 (family 0x19 with AVX-512) it picks the
Skylake-X set, whose AVX-512 kernels run on Zen 4's double-pumped 256-bit units slower than its
AVX2 (Haswell) set.  Measured on this project's machine (one thread, float32 GEMM, GFLOP/s,
Skylake-X -> Haswell): 64x512x1024 79 -> 96, 16x100x2048 49 -> 81, 20x200x800 80 -> 88,
512x512x512 104 -> 108; no shape measured slower (``python -m benchmarks.blas``).  PyTorch's
MKL measured 93, 65, 83 and 101 on the same shapes.

How: OpenBLAS reads ``OPENBLAS_CORETYPE`` in ``gotoblas_dynamic_init``, which both OpenBLAS
builds export beside ``gotoblas_dynamic_quit``; ``tune`` sets the variable, re-runs the two
and restores the environment.  The switch changes block sizes and kernels, not the buffers,
and happens once per library, when fusegrad first sees it loaded, before fusegrad has started
any thread that could be inside BLAS.  Results stay within float rounding of the old kernels'
(the summation order within a dot product differs).

Settings: ``FUSEGRAD_BLAS_KERNELS=auto`` (the default: the rule above), ``keep`` (never
switch), or a core name OpenBLAS knows (``Haswell``, ``SkylakeX``, ...).  A user's own
``OPENBLAS_CORETYPE`` always wins: then fusegrad switches nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

# the kernel sets whose AVX-512 code runs double-pumped on Zen 4
_WIDE_SETS = ("skylakex", "cooperlake", "sapphirerapids")
_seen: dict[str, str] = {}  # library path -> its kernel set after tune() looked at it


def cpu_description(text: str) -> dict[str, Any]:
    """Vendor, family and flags of the first processor in ``/proc/cpuinfo``'s ``text``."""
    info: dict[str, Any] = {"vendor": "", "family": -1, "flags": frozenset()}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor only
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id":
            info["vendor"] = value
        elif key == "cpu family" and value.isdigit():
            info["family"] = int(value)
        elif key == "flags":
            info["flags"] = frozenset(value.split())
    return info


def preferred_kernels(
    cpu: dict[str, Any], current: str, setting: str, numpys: bool = True
) -> str | None:
    """The kernel set to switch to, or None to keep ``current``.  ``setting`` is
    ``FUSEGRAD_BLAS_KERNELS``: ``auto``, ``keep`` or a core name (which applies to every
    OpenBLAS loaded); ``numpys``: whether the library is numpy's own copy (the only one the
    ``auto`` rule switches)."""
    if setting == "keep" or not current:
        return None
    if setting != "auto":
        return None if setting.lower() == current.lower() else setting
    if not numpys:
        return None
    zen4 = cpu["vendor"] == "AuthenticAMD" and cpu["family"] == 0x19 and "avx512f" in cpu["flags"]
    if zen4 and current.lower() in _WIDE_SETS:
        return "Haswell"
    return None


def _loaded_openblas() -> list[str]:
    """The paths of the OpenBLAS libraries mapped into this process (Linux only)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    paths: list[str] = []
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if "openblas" in name and ".so" in name and path not in paths:
            paths.append(path)
    return paths


def _corename_function(lib: Any) -> Any:
    """The library's ``get_corename`` under whichever symbol prefix its build uses."""
    for symbol in (
        "openblas_get_corename",
        "openblas_get_corename64_",
        "scipy_openblas_get_corename",
        "scipy_openblas_get_corename64_",
    ):
        function = getattr(lib, symbol, None)
        if function is not None:
            function.restype = ctypes.c_char_p
            function.argtypes = []
            return function
    return None


def _open(path: str) -> tuple[Any, Any] | None:
    """The loaded library at ``path`` and its ``get_corename``, or None where it cannot switch
    kernel sets (a build without ``DYNAMIC_ARCH`` exports no ``gotoblas_dynamic_init``)."""
    try:
        lib = ctypes.CDLL(path)  # already mapped: the same instance, no second load
    except OSError:
        return None
    corename = _corename_function(lib)
    if corename is None or not hasattr(lib, "gotoblas_dynamic_init"):
        return None
    if not hasattr(lib, "gotoblas_dynamic_quit"):
        return None
    return lib, corename


def _switch(lib: Any, corename: Any, name: str) -> str:
    """Re-run OpenBLAS's kernel choice with ``OPENBLAS_CORETYPE=name``; its new kernel set."""
    before = os.environ.get("OPENBLAS_CORETYPE")
    os.environ["OPENBLAS_CORETYPE"] = name
    try:
        lib.gotoblas_dynamic_quit()
        lib.gotoblas_dynamic_init()
    finally:
        if before is None:
            del os.environ["OPENBLAS_CORETYPE"]
        else:
            os.environ["OPENBLAS_CORETYPE"] = before
    return corename().decode(errors="replace")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return ""


def tune() -> dict[str, str]:
    """Look at each OpenBLAS library loaded since the last call and switch its kernel set
    where ``preferred_kernels`` says so.  Returns every library seen so far and its kernel
    set.  Cheap to call again: a library is looked at once."""
    if not sys.platform.startswith("linux") or "OPENBLAS_CORETYPE" in os.environ:
        return dict(_seen)
    setting = os.environ.get("FUSEGRAD_BLAS_KERNELS", "auto").strip() or "auto"
    paths = [p for p in _loaded_openblas() if p not in _seen]
    if not paths:
        return dict(_seen)
    cpu = cpu_description(_cpuinfo())
    for path in paths:
        opened = _open(path)
        if opened is None:
            _seen[path] = ""
            continue
        lib, corename = opened
        current = corename().decode(errors="replace")
        numpys = os.sep + "numpy.libs" + os.sep in path
        target = preferred_kernels(cpu, current, setting, numpys)
        _seen[path] = _switch(lib, corename, target) if target else current
    return dict(_seen)
