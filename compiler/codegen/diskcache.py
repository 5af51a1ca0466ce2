"""The disk cache of compiled code: where it lives, how a generated module is written and
imported, and how numba's own cache files are kept from ever breaking a run.

Where it sits in the pipeline: an emitter (``numba_cpu``, ``numba_cuda``) produces a module's
source; ``common.load_module`` names it (a hash of the source and every codegen flag,
docs/ARCHITECTURE.md,
contract 7) and calls ``load_module`` here, which writes the source into the cache directory
and imports it.  numba's ``cache=True`` then keeps each function's machine code in an index
file (``.nbi``: which signature is in which data file, for which source) and data files
(``.nbc``: the pickled compile result), in a ``__pycache__`` beside the module or under
``NUMBA_CACHE_DIR``.  ``guard_module`` puts a guarded cache on every numba function of such a
module, and of the package's own precompiled functions (the interpreter, the float32 helpers).

The rules (docs/ARCHITECTURE.md, contract 10), and how they hold:

* **Location.**  ``FUSEGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/fusegrad``, else
  ``~/.cache/fusegrad``: per user.  A directory that cannot be written is never replaced by
  another (the old fallback, a directory under the system temp dir shared by every user, let
  anyone plant pickled code that numba would load); it gives one ``RuntimeWarning`` per
  directory per process and everything is compiled in memory.  Whether a directory is usable is
  decided once (``cache_dir``, on the hot path of program creation) by creating a file of a
  unique name in it, which cannot collide with another thread's or process's probe.
* **Writing.**  A module is written to a temporary file of a unique name (process, thread and
  a random part) and renamed over the target atomically: readers see the old file or the new
  one, never a torn one, and concurrent writers never rename each other's files.
* **Reading.**  A module is executed from the source held in memory, compiled under the
  file's path, after checking that the file holds exactly that source (else it is rewritten):
  neither a stale, garbled or foreign file nor a stale ``.pyc`` is ever executed, and numba's
  source stamp (a hash of the file) matches what runs.
* **numba's files.**  ``_GuardedCache`` (a subclass of numba's own cache class, CPU or CUDA)
  treats any failure to load an entry (truncated or garbled pickle, a directory where a file
  should be, an entry written for another module) as a miss: it logs it on the ``cache``
  channel, removes that function's index and data files, and numba compiles anew and rewrites
  them.  Data files carry a checksum over their name and contents (``_ChecksummedFile``), so a
  garbled payload, or one copied from another module's file, is refused instead of loaded and
  run: without it, numba runs whatever machine code a data file holds.  A failure to save is
  logged and the compiled code is kept in memory.
* **Counters.**  The guarded cache is also where numba reports each specialisation it needs:
  for the functions a program calls (``entry_points``), a load counts one ``disk_hits``, a
  compilation one ``compiles`` (``events.Counters``, through the event stream), whichever
  variant and whenever it happens.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import linecache
import marshal
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import types
import warnings
from collections.abc import Collection
from typing import Any

from numba.core.caching import FunctionCache, NullCache

from fusegrad._numba_cache import FastFunctionCache
from fusegrad._numba_cache import subclass as _subclass

from .. import events, logs
from ..events import emit

__all__ = [
    "CorruptCacheEntry",
    "cache_dir",
    "configured_cache_dir",
    "guard",
    "guard_module",
    "load_module",
    "write_atomically",
]


class CorruptCacheEntry(ValueError):
    """A numba data file whose checksum does not match its name and contents."""


# ---- location ---------------------------------------------------------------------------------

# configured path -> the usable directory, or None (compile in memory); decided once per path
_usable: dict[str, str | None] = {}
_usable_lock = threading.Lock()


def configured_cache_dir() -> str:
    """The directory the configuration asks for: ``FUSEGRAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fusegrad`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says),
    else ``~/.cache/fusegrad``."""
    path = os.environ.get("FUSEGRAD_CACHE_DIR")
    if path:
        return os.path.abspath(os.path.expanduser(path))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusegrad")


def cache_dir() -> str | None:
    """The cache directory, or None when it cannot be used (then code is compiled in memory,
    after one warning).  The configuration is read on every call (tests and users change it);
    each directory is probed once per process."""
    path = configured_cache_dir()
    try:
        return _usable[path]
    except KeyError:
        pass
    with _usable_lock:  # one probe (and at most one warning) per directory
        if path not in _usable:
            _usable[path] = _probe(path)
        return _usable[path]


def _probe(path: str) -> str | None:
    """``path`` if this process can create files in it (created if missing, private to the user),
    else None after one warning.  The probe file has a unique name (``mkstemp``): probes of
    other threads and processes never touch it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        message = (
            f"fusegrad: the cache directory {path!r} cannot be used ({error}); generated code is "
            "compiled in memory and not cached (set FUSEGRAD_CACHE_DIR to a writable directory)"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logs.log("cache", message)
        return None
    return path


# ---- writing and importing generated modules --------------------------------------------------


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file of a unique name in the same directory
    (process id, thread id and a random part) renamed over ``path``: a reader sees the old file
    or the new one, never a partial one."""
    directory, name = os.path.split(path)
    fd, temporary = tempfile.mkstemp(
        dir=directory, prefix=f".{name}.{os.getpid()}.{threading.get_ident()}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _remove(path: str) -> None:
    """Remove a file, or a directory found where a file belongs."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _stored_source_matches(path: str, expected: bytes) -> bool:
    """Whether ``path`` holds exactly ``expected``; anything else (missing, unreadable, a
    directory, other bytes) is logged unless missing, and removed when it is not a file."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == expected:
                return True
        logs.log("cache", f"{path}: not the expected source (corrupt or stale); rewriting it")
    except FileNotFoundError:
        return False
    except OSError as error:
        logs.log("cache", f"{path}: unreadable ({error}); replacing it")
        if os.path.isdir(path):
            with contextlib.suppress(OSError):
                _remove(path)
    return False


# numba functions are compiled from generated source; executing one module twice at once would
# only duplicate work, so loading is serialised (it takes milliseconds: compilation is lazy)
_load_lock = threading.Lock()


def load_module(
    name: str,
    source: str,
    loaded: dict[str, types.ModuleType],
    entry_points: Collection[str] | None = None,
) -> tuple[types.ModuleType, str, bool]:
    """Import the generated module ``name`` from ``source``; returns (module, path, was_on_disk).

    ``loaded`` is the caller's table of modules already imported in this process;
    ``entry_points`` names the functions programs call, whose compiles and loads are counted
    (None: every function of the module).  The source
    goes to ``cache_dir()/name.py`` (written when missing or different), and the module runs
    from it with numba's disk cache guarded (``guard_module``).  When the directory cannot be
    used or the file cannot be written or imported, the module is compiled in memory instead
    (numba without disk cache); ``path`` is then a ``<...>`` pseudo file name."""
    with _load_lock:
        module = loaded.get(name)
        if module is not None:
            return module, _path_of(module), True
        directory = cache_dir()
        module = None
        on_disk = False
        if directory is not None:
            path = os.path.join(directory, name + ".py")
            encoded = source.encode()
            on_disk = _stored_source_matches(path, encoded)
            try:
                if not on_disk:
                    os.makedirs(directory, mode=0o700, exist_ok=True)  # removed since its probe?
                    write_atomically(path, encoded)
                module = _import_file(name, path, source)
            except Exception as error:  # never fatal: the module still compiles in memory
                logs.log("cache", f"{path}: cannot be written or imported ({error}); in memory")
                on_disk = False
        if module is None:
            module = _import_in_memory(name, source)
        guard_module(module, entry_points)
        loaded[name] = module
        return module, _path_of(module), on_disk


def _path_of(module: types.ModuleType) -> str:
    return getattr(module, "__file__", None) or f"<in memory: {module.__name__}>"


def _compiled(path: str, source: str) -> types.CodeType:
    """``source`` compiled as the file ``path``: from ``path``'s code file (``.fgc``: marshalled
    bytecode behind a checksum over the source, the path, Python's bytecode magic and the
    bytecode itself) when it matches, else compiled and the code file written.  Compiling the
    GPT step's generated modules took about half of a warm start's program load; a code
    file that does not match (another source, another Python, garbled) is never run."""
    salt = path.encode() + b"\0" + importlib.util.MAGIC_NUMBER + b"\0" + source.encode()
    code_path = path[: -len(".py")] + ".fgc" if path.endswith(".py") else path + ".fgc"
    try:
        with open(code_path, "rb") as fh:
            blob = fh.read()
        digest, payload = blob[:32], blob[32:]
        if digest == hashlib.sha256(salt + payload).digest():
            return marshal.loads(payload)  # type: ignore[no-any-return]
        logs.log("cache", f"{code_path}: not this source's bytecode; compiling it again")
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, TypeError) as error:
        logs.log("cache", f"{code_path}: unreadable ({error}); compiling it again")
    code = compile(source, path, "exec")
    payload = marshal.dumps(code)
    try:
        write_atomically(code_path, hashlib.sha256(salt + payload).digest() + payload)
    except OSError as error:
        logs.log("cache", f"{code_path}: not written ({error})")
    return code


def _import_file(name: str, path: str, source: str) -> types.ModuleType:
    """Execute ``source`` as module ``name`` whose file is ``path`` (which holds ``source``).
    The code is ``source``'s own (``_compiled``), never a ``.pyc``'s: what runs is what was
    checked."""
    code = _compiled(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before execution: numba's cache locates functions by module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# ``cache=True`` in the decorators the emitters write (``@numba.njit(cache=True, ...)``,
# ``@cuda.jit(cache=True)``): numba refuses to cache a function without a source file
_CACHE_FLAG = re.compile(r"^(\s*@[\w.]+\()cache=True\b", re.MULTILINE)


def _import_in_memory(name: str, source: str) -> types.ModuleType:
    """Execute ``source`` as module ``name`` without any file: numba's disk cache is switched
    off in its decorators.  The source is registered with ``linecache`` so tracebacks and
    numba's error messages still show it."""
    uncached = _CACHE_FLAG.sub(r"\1cache=False", source)
    filename = f"<in memory: {name}>"
    linecache.cache[filename] = (len(uncached), None, uncached.splitlines(True), filename)
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(uncached, filename, "exec"), module.__dict__)
    except BaseException as error:
        sys.modules.pop(name, None)
        raise RuntimeError(f"generated module {name} failed to import: {error}") from error
    return module


# ---- numba's cache files ----------------------------------------------------------------------

_MAGIC = b"fusegrad-nbc-1\n"
_HEADER = len(_MAGIC) + hashlib.sha256().digest_size


def _checksum(name: str, payload: bytes) -> bytes:
    # the name binds a data file to its function and signature slot: a payload copied from
    # another module's file (numba would load and run it) fails the check
    return hashlib.sha256(name.encode() + b"\0" + payload).digest()


def _read_data_file(path: str, name: str) -> bytes:
    """The payload of data file ``path`` (named ``name``), or ``CorruptCacheEntry``."""
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
    except IsADirectoryError as error:
        # numba takes an OSError here for a file removed since the index named it (a miss),
        # but a directory would stay and break every save after it: it must be removed
        raise CorruptCacheEntry(f"{path}: a directory, not a data file") from error
    payload = blob[_HEADER:]
    if not blob.startswith(_MAGIC) or blob[len(_MAGIC) : _HEADER] != _checksum(name, payload):
        raise CorruptCacheEntry(f"{path}: checksum does not match (corrupt or foreign data)")
    return payload


class _ChecksummedFile:
    """Mixin over numba's ``IndexDataCacheFile`` (CPU or CUDA): data files are written as a
    magic line, a checksum of their name and payload, and the payload; a data file that does
    not check is refused with ``CorruptCacheEntry``."""

    def _save_data(self, name: str, data: Any) -> None:
        payload = self._dump(data)  # type: ignore[attr-defined]
        with self._open_for_write(self._data_path(name)) as fh:  # type: ignore[attr-defined]
            fh.write(_MAGIC + _checksum(name, payload) + payload)

    def _load_data(self, name: str) -> Any:
        path = self._data_path(name)  # type: ignore[attr-defined]
        return pickle.loads(_read_data_file(path, name))


class _GuardedCache:
    """Mixin over numba's per-function cache class (``FunctionCache``, or numba-cuda's
    ``CUDACache``): loading never raises (an unusable entry is logged, removed and compiled
    anew), saving never raises, data files are checksummed, and for an entry point each load
    counts a disk hit and each compilation a compile."""

    _cache_path: str
    _py_func: Any
    _impl: Any

    def __init__(self, py_func: Any, counted: bool) -> None:
        super().__init__(py_func)  # type: ignore[call-arg]
        self.counted = counted
        base = type(self._cache_file)  # type: ignore[has-type]
        self._cache_file = _subclass("Checksummed", _ChecksummedFile, base)(
            cache_path=self._cache_path,
            filename_base=self._impl.filename_base,
            source_stamp=self._impl.locator.get_source_stamp(),
        )

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            result = super().load_overload(sig, target_context)  # type: ignore[misc]
        except Exception as error:
            self._discard(f"{type(error).__name__}: {error}")
            return None
        if result is not None and self.counted:
            emit(events.NUMBA_LOADED, self._describe())
        return result

    def save_overload(self, sig: Any, data: Any) -> None:
        # numba calls this right after compiling a specialisation (and only then)
        if self.counted:
            emit(events.NUMBA_COMPILED, self._describe())
        try:
            super().save_overload(sig, data)  # type: ignore[misc]
        except Exception as error:
            logs.log("cache", f"{self._describe()}: not saved to disk ({error}); kept in memory")

    def _describe(self) -> str:
        return f"{self._py_func.__module__}.{self._py_func.__qualname__}"

    def _discard(self, reason: str) -> None:
        """Remove this function's index and data files (numba then compiles and rewrites them)."""
        base = self._impl.filename_base
        removed = []
        try:
            names = os.listdir(self._cache_path)
        except OSError:
            names = []
        for entry in names:
            if entry == base + ".nbi" or (entry.startswith(base + ".") and entry.endswith(".nbc")):
                try:
                    _remove(os.path.join(self._cache_path, entry))
                    removed.append(entry)
                except OSError as error:
                    logs.log("cache", f"cannot remove {entry}: {error}")
        logs.log(
            "cache",
            f"numba cache entry of {self._describe()} in {self._cache_path} is unusable "
            f"({reason}); removed {removed or 'nothing'}, compiling anew",
        )


class _UncachedCounter(NullCache):  # type: ignore[misc]
    """numba's no-op cache, for entry points compiled without a disk cache: it counts each
    compilation (numba calls ``save_overload`` after every one)."""

    def save_overload(self, sig: Any, data: Any) -> None:
        emit(events.NUMBA_COMPILED, "an entry point without a disk cache")


def guard(function: Any, counted: bool) -> None:
    """Give numba function ``function`` (a CPU or CUDA dispatcher) a guarded cache in place of
    numba's own; ``counted``: it is an entry point whose specialisations the counters count.
    Functions without a cache object (the CUDA simulator's) are left alone: nothing is compiled
    or cached for them."""
    current = getattr(function, "_cache", None)
    if current is None or isinstance(current, (_GuardedCache, _UncachedCounter)):
        return
    if isinstance(current, NullCache) or type(current).__name__ == "NullCache":
        if counted:
            function._cache = _UncachedCounter()
        return
    base = type(current)
    if base is FunctionCache:  # (CPU: loaded without numba's start-up work, fusegrad._numba_cache)
        base = FastFunctionCache
    try:
        guarded = _subclass("Guarded", _GuardedCache, base)
        function._cache = guarded(function.py_func, counted)
    except Exception as error:  # numba's own cache stays: it works, only unguarded
        logs.log("cache", f"cannot guard the numba cache of {function!r}: {error}")


def guard_module(module: types.ModuleType, entry_points: Collection[str] | None = None) -> None:
    """``guard`` every numba function defined in ``module`` (not those it imports); the ones
    named in ``entry_points`` are counted (all of them when None: a generated module)."""
    for name, value in list(vars(module).items()):
        py_func = getattr(value, "py_func", None)
        if py_func is None or getattr(py_func, "__module__", None) != module.__name__:
            continue
        guard(value, counted=entry_points is None or name in entry_points)
