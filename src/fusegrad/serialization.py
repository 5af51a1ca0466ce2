"""``fusegrad.save`` / ``fusegrad.load``: tensors, Parameters, state dicts and nested containers
of them in one file, as ``torch.save`` / ``torch.load``.

File format (fusegrad's own; PyTorch's files are not read): a zip archive (stored, not
compressed) holding

* ``fusegrad/version``: the format version (``1``);
* ``fusegrad/data.pkl``: the object, pickled (protocol ``pickle_protocol``), where every tensor,
  numpy array, numpy scalar, dtype and device is a *persistent id* instead of a pickled object:
  ``("tensor", n, kind, requires_grad, device)`` (kind ``tensor`` or ``parameter``),
  ``("ndarray", n)``, ``("npscalar", n)``, ``("dtype", name)``, ``("device", name)``;
* ``fusegrad/data/<n>.npy``: the values of record ``n`` in numpy's ``.npy`` format (read back
  with ``allow_pickle=False``), bit for bit; bfloat16 values (which ``.npy`` cannot name) are
  stored as their uint16 bits, with an empty ``fusegrad/data/<n>.bfloat16`` beside them.

A tensor saved twice (the same object, as a tied weight in a state dict) is one record and loads
as one tensor; distinct views of one storage load as distinct tensors (PyTorch keeps them
sharing).  Gradients, hooks and autograd history are not saved (``requires_grad`` is).

``load(weights_only=True)`` (the default, as in PyTorch 2.6+) unpickles with a restricted
unpickler: only containers and plain values (dict, OrderedDict, list, tuple, set, str, numbers,
bool, None, slice, ``fusegrad.Size``) plus the persistent records above; any other global (a
class, a function such as ``os.system``) is refused with ``pickle.UnpicklingError`` before it
is called.  ``weights_only=False`` unpickles anything and so runs whatever code the file names:
only for files you trust (whole pickled modules, for instance).

``save`` to a path writes a temporary file in the same directory, flushes and fsyncs it, then
renames it over the target (``os.replace``, atomic), so a crash never leaves a half-written
checkpoint under the target's name.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import os
import pickle
import threading
import zipfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from . import dtypes as _dt
from .device import as_device
from .device import device as _device_type
from .nn.parameter import Parameter
from .size import Size
from .tensor import Tensor

FORMAT_VERSION = "1"
_PREFIX = "fusegrad/"
DEFAULT_PROTOCOL = 2

# globals a weights-only load may resolve: containers and plain values, nothing callable that
# could run code with the file's arguments
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("fusegrad.size", "Size"): Size,
}


# globals the user allowed for weights-only loads: ``add_safe_globals`` (for the process) and
# ``safe_globals`` (for a block, this thread)
_USER_GLOBALS: list[Any] = []
_scoped = threading.local()


def _key_of(entry: Any) -> tuple[tuple[str, str], Any]:
    """``(module, name)`` and the object of an allowed global: the object itself, or a pair
    ``(object, "module.name")`` naming the path a file stores it under."""
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        obj, path = entry
        module, _, name = path.rpartition(".")
        return (module, name), obj
    return (entry.__module__, entry.__qualname__), entry


def _allowed_by_user(module: str, name: str) -> Any:
    for entry in [*getattr(_scoped, "entries", ()), *_USER_GLOBALS]:
        key, obj = _key_of(entry)
        if key == (module, name):
            return obj
    return None


def add_safe_globals(safe_globals: list[Any]) -> None:
    """Allow these globals (classes, functions, or ``(object, "module.name")`` pairs) in
    ``load(weights_only=True)`` for the rest of the process: trust the file's authors to use
    them only as data."""
    for entry in safe_globals:
        _key_of(entry)  # (checks the entry's form)
        _USER_GLOBALS.append(entry)


def get_safe_globals() -> list[Any]:
    """The globals ``add_safe_globals`` allowed."""
    return list(_USER_GLOBALS)


def clear_safe_globals() -> None:
    """Forget the globals ``add_safe_globals`` allowed."""
    _USER_GLOBALS.clear()


class safe_globals:  # noqa: N801  (PyTorch's name)
    """``with safe_globals([...]):`` allows the globals in weights-only loads in the block (in
    this thread), as ``add_safe_globals`` does for the process."""

    def __init__(self, safe_globals: list[Any]) -> None:
        for entry in safe_globals:
            _key_of(entry)
        self._entries = list(safe_globals)
        self._saved: tuple = ()

    def __enter__(self) -> safe_globals:
        self._saved = tuple(getattr(_scoped, "entries", ()))
        _scoped.entries = (*self._saved, *self._entries)
        return self

    def __exit__(self, *exc: Any) -> None:
        _scoped.entries = self._saved


class WeightsOnlyUnpicklingError(pickle.UnpicklingError):
    """A ``weights_only=True`` load met a global it does not allow."""


def _file_target(f: Any) -> str | None:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    return None


# ---- save ------------------------------------------------------------------------------------


class _Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], protocol: int) -> None:
        super().__init__(file, protocol)
        self.records: list[np.ndarray] = []
        self._ids: dict[int, tuple] = {}  # id(tensor) -> its record (one record per object)
        self._keep: list[Any] = []  # keeps those objects alive while their ids are in use

    def _record(self, obj: Any, arr: np.ndarray) -> int:
        arr = np.asarray(arr)
        self.records.append(arr if arr.flags.c_contiguous else arr.copy(order="C"))
        self._keep.append(obj)
        return len(self.records) - 1

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            known = self._ids.get(id(obj))
            if known is not None:
                return known
            kind = "parameter" if isinstance(obj, Parameter) else "tensor"
            n = self._record(obj, np.asarray(obj.detach().cpu().numpy()))
            pid = ("tensor", n, kind, bool(obj.requires_grad), str(obj.device))
            self._ids[id(obj)] = pid
            return pid
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise pickle.PicklingError("fusegrad.save: numpy arrays of objects are not saved")
            return ("ndarray", self._record(obj, obj))
        if isinstance(obj, np.generic):
            return ("npscalar", self._record(obj, np.asarray(obj)))
        if isinstance(obj, _dt.dtype):
            return ("dtype", obj.name)
        if isinstance(obj, _device_type):
            return ("device", str(obj))
        return None


def save(
    obj: Any,
    f: str | os.PathLike | IO[bytes],
    pickle_module: Any = None,
    pickle_protocol: int = DEFAULT_PROTOCOL,
    _use_new_zipfile_serialization: bool = True,
) -> None:
    """Write ``obj`` (tensors, state dicts, nested containers, ...) to ``f``, a path or a
    writable binary file object.  ``pickle_module`` is accepted for PyTorch's signature; the
    standard ``pickle`` writes the file."""
    payload = io.BytesIO()
    pickler = _Pickler(payload, pickle_protocol)
    pickler.dump(obj)
    path = _file_target(f)
    if path is None:
        _write_archive(f, payload.getvalue(), pickler.records)
        return
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(
        directory,
        f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp",
    )
    try:
        with open(tmp, "wb") as fh:
            _write_archive(fh, payload.getvalue(), pickler.records)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_archive(fh: IO[bytes], data: bytes, records: list[np.ndarray]) -> None:
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(_PREFIX + "version", FORMAT_VERSION)
        zf.writestr(_PREFIX + "data.pkl", data)
        for n, arr in enumerate(records):
            buf = io.BytesIO()
            if arr.dtype.name == "bfloat16" and _dt.is_stored(arr.dtype):  # (by name first: no
                # import of ml_dtypes where no array can be its bfloat16)
                arr = arr.view(np.uint16)  # (.npy has no bfloat16: its bits, marked)
                zf.writestr(f"{_PREFIX}data/{n}.bfloat16", b"")
            np.save(buf, arr, allow_pickle=False)
            zf.writestr(f"{_PREFIX}data/{n}.npy", buf.getvalue())


# ---- load ------------------------------------------------------------------------------------


def _target_device(saved: str, map_location: Any) -> Any:
    if map_location is None:
        return saved
    if isinstance(map_location, dict):
        return map_location.get(saved, saved)
    if isinstance(map_location, (str, _device_type)):
        return map_location
    raise TypeError(
        f"load: map_location must be None, a str, a device, a dict or a callable, got "
        f"{type(map_location).__name__}"
    )


class _Unpickler(pickle.Unpickler):
    def __init__(
        self,
        file: IO[bytes],
        archive: zipfile.ZipFile,
        map_location: Any,
        weights_only: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(file, **kwargs)
        self._archive = archive
        self._map_location = map_location
        self._weights_only = weights_only
        self._loaded: dict[int, Tensor] = {}

    def find_class(self, module: str, name: str) -> Any:
        if not self._weights_only:
            return super().find_class(module, name)
        # protocol 2 writes Python 2's module names (``__builtin__``): read them as Python 3's
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        found = _SAFE_GLOBALS.get((module, name))
        if found is None:
            found = _allowed_by_user(module, name)
        if found is None:
            raise WeightsOnlyUnpicklingError(
                "Weights only load failed: the file names the global "
                f"{module}.{name}, which weights_only=True does not allow (only containers, "
                "plain values and tensors are loaded). Load with weights_only=False only if "
                "you trust the file's source: unpickling it can run arbitrary code."
            )
        return found

    def _array(self, n: int) -> np.ndarray:
        with self._archive.open(f"{_PREFIX}data/{n}.npy") as fh:
            arr = np.load(io.BytesIO(fh.read()), allow_pickle=False)
        if f"{_PREFIX}data/{n}.bfloat16" in self._archive.NameToInfo:
            if _dt.bfloat16 is None:
                raise pickle.UnpicklingError(
                    "load: the file holds bfloat16 values, which need the optional ml_dtypes "
                    "package (pip install ml_dtypes)"
                )
            arr = arr.view(_dt.bfloat16.np)
        return arr

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError(f"load: unknown persistent record {pid!r}")
        tag = pid[0]
        if tag == "tensor":
            _, n, kind, requires_grad, saved_device = pid
            if n in self._loaded:
                return self._loaded[n]
            t = self._tensor(self._array(n), kind, bool(requires_grad), str(saved_device))
            self._loaded[n] = t
            return t
        if tag == "ndarray":
            return self._array(pid[1])
        if tag == "npscalar":
            return self._array(pid[1])[()]
        if tag == "dtype":
            return _dt.as_dtype(pid[1])
        if tag == "device":
            return as_device(pid[1])
        raise pickle.UnpicklingError(f"load: unknown persistent record {pid!r}")

    def _tensor(self, arr: np.ndarray, kind: str, requires_grad: bool, saved: str) -> Tensor:
        t = Tensor._make(arr)
        ml = self._map_location
        if callable(ml) and not isinstance(ml, (dict, str, _device_type)):
            moved = ml(t, saved)
            t = moved if isinstance(moved, Tensor) else t
        else:
            target = as_device(_target_device(saved, ml))
            if target != t.device:
                t = t.to(target)
        if kind == "parameter":
            return Parameter(t, requires_grad)
        return t.requires_grad_(True) if requires_grad else t


def load(
    f: str | os.PathLike | IO[bytes],
    map_location: str | Any | dict | Callable | None = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = True,
    mmap: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Read an object written by ``fusegrad.save`` from a path or a readable binary file.

    ``map_location``: where tensors go (a device or its name, a dict from saved device names to
    new ones, or a callable ``fn(tensor, saved_device_name)`` returning the tensor to use);
    by default the device they were saved from.  ``weights_only`` (default True): refuse every
    global but plain containers and values (see the module docstring).  ``pickle_module`` and
    ``mmap`` are accepted for PyTorch's signature and ignored."""
    if weights_only is None:
        weights_only = True
    path = _file_target(f)
    fh: IO[bytes] = open(path, "rb") if path is not None else f  # noqa: SIM115
    try:
        if not zipfile.is_zipfile(fh):
            raise pickle.UnpicklingError(
                "load: not a fusegrad file (fusegrad.save writes a zip archive with "
                "fusegrad/data.pkl; PyTorch's own files are not read)"
            )
        fh.seek(0)
        with zipfile.ZipFile(fh) as archive:
            names = set(archive.namelist())
            if _PREFIX + "data.pkl" not in names:
                raise pickle.UnpicklingError("load: not a fusegrad file (no fusegrad/data.pkl)")
            version = archive.read(_PREFIX + "version").decode()
            if version != FORMAT_VERSION:
                raise pickle.UnpicklingError(
                    f"load: file format version {version}, this fusegrad reads {FORMAT_VERSION}"
                )
            data = io.BytesIO(archive.read(_PREFIX + "data.pkl"))
            unpickler = _Unpickler(data, archive, map_location, weights_only, **pickle_load_args)
            return unpickler.load()
    finally:
        if path is not None:
            fh.close()
