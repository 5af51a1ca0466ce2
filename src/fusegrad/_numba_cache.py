"""Loading fusegrad's numba functions from numba's disk cache, without numba's start-up work.

Where this sits: below the kernels.  Each eager kernel module (``ops/*_kernels.py``, the fused
optimizers) ends with ``fast_loading(globals())``, which gives its cached numba functions a
``FastFunctionCache``; the compiler's guarded cache (``compiler/codegen/diskcache.py``) builds
on the same class for generated code, the interpreter and the float32 helpers.

Why: a process that finds everything in the disk cache (a warm start) spent most of the time
until its first compiled step in two pieces of numba's loading that a load does not need.

* ``Cache.load_overload`` calls ``target_context.refresh()`` before every load: it imports
  every lowering and typing registry numba has (``numba.np.arraymath``, which imports
  ``scipy.linalg`` to check for BLAS, the typed containers, the random generators, ...), about
  0.15-0.3 s once per process.  Those registries are for compiling; numba's compiler refreshes
  them itself before any compilation (``CompilerBase.__init__``), so a later compile in the same
  process still finds them.  What a load does need from it is the runtime (NRT), whose
  functions loaded code calls: ``load_overload`` here initialises that alone.
* Rebuilding a cached library parses its "shared" LLVM bitcode (the module another library
  would link it from) at every load: 2.9 MB for the GPT step's native program, 0.25-0.8 s.
  Nothing links against code that was only loaded, unless something compiled later calls it;
  ``LazyLinking`` parses it then, on first use.  The names the machine code defines, which
  numba's JIT engine records from that module, are read from the object file's symbol table
  (``elf_symbols``).

Safety: loaded machine code is only handed to LLVM when every symbol it refers to resolves
(defined by code the engine already holds, or registered with LLVM, or in the process); where
one does not, the registries are loaded first as numba would (some register symbols when
imported), and anything this module does not recognise (another serialisation, an object file
that is not ELF64, a numba whose internals differ) goes through numba's own loading.
"""

from __future__ import annotations

import inspect
import struct
from typing import Any

import llvmlite.binding as llvm
from numba.core.caching import CompileResultCacheImpl, FunctionCache
from numba.core.codegen import CPUCodeLibrary
from numba.core.compiler import CompileResult
from numba.core.runtime import rtsys

__all__ = ["FastFunctionCache", "FastLoading", "elf_symbols", "fast_load", "fast_loading"]


def elf_symbols(blob: bytes) -> tuple[set[str], set[str]] | None:
    """The names an ELF64 little-endian object file defines (symbol table entries with a
    section, other than section and file symbols) and those it needs from elsewhere (undefined,
    not weak), or None for any other format or a table that does not parse."""
    if len(blob) < 64 or blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", blob, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", blob, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)
        ]
        defined: set[str] = set()
        needed: set[str] = set()
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind != 2 or entsize != 24:  # SHT_SYMTAB of Elf64_Sym entries
                continue
            strtab = sections[link]
            strings = blob[strtab[4] : strtab[4] + strtab[5]]
            for st_name, info, _other, shndx, _value, _size in struct.iter_unpack(
                "<IBBHQQ", blob[offset : offset + size]
            ):
                if st_name == 0 or (info & 0xF) in (3, 4):  # unnamed, STT_SECTION, STT_FILE
                    continue
                name = strings[st_name : strings.index(b"\0", st_name)].decode()
                if shndx != 0:
                    defined.add(name)
                elif info >> 4 != 2:  # undefined and not STB_WEAK
                    needed.add(name)
        return defined, needed
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None


class LazyLinking:
    """Mixin over numba's CPU code library, for one loaded from the disk cache: its linking
    module is parsed from the stored bitcode when something first links against it."""

    _fg_bitcode: bytes | None
    _shared_module: Any

    def _get_module_for_linking(self) -> Any:
        if self._shared_module is None and self._fg_bitcode is not None:
            self._shared_module = llvm.parse_bitcode(self._fg_bitcode)
            self._fg_bitcode = None
        return super()._get_module_for_linking()  # type: ignore[misc]


_REBUILD_PARAMETERS = (
    "target_context",
    "libdata",
    "fndesc",
    "env",
    "signature",
    "objectmode",
    "lifted",
    "typeann",
    "reload_init",
    "referenced_envs",
)


def _supported() -> bool:
    """Whether this numba's cache, ``CompileResult._rebuild`` and CPU code library are the ones
    this module repeats parts of (else numba's own loading runs, unchanged)."""
    try:
        parameters = tuple(inspect.signature(CompileResult._rebuild).parameters)
    except (TypeError, ValueError):
        return False
    return (
        parameters == _REBUILD_PARAMETERS
        and all(
            hasattr(CPUCodeLibrary, name)
            for name in (
                "enable_object_caching",
                "_set_compiled_object",
                "_finalize_final_module",
                "_get_module_for_linking",
            )
        )
        and all(
            hasattr(FunctionCache, name)
            for name in ("_load_overload", "_guard_against_spurious_io_errors")
        )
        and hasattr(rtsys, "initialize")
    )


SUPPORTED = _supported()

# (mixin, numba base class) -> their subclass, made once
_subclasses: dict[tuple[type, type], type] = {}


def subclass(prefix: str, mixin: type, base: type) -> type:
    """The class ``prefix + base.__name__`` deriving from ``mixin`` then ``base`` (one per pair)."""
    cls = _subclasses.get((mixin, base))
    if cls is None:
        namespace = {"__module__": __name__}
        cls = _subclasses[mixin, base] = type(prefix + base.__name__, (mixin, base), namespace)
    return cls


def _resolves(codegen: Any, names: set[str]) -> bool:
    engine = codegen._engine
    return all(
        engine.is_symbol_defined(name) or llvm.address_of_symbol(name) is not None for name in names
    )


class LazyRebuild:
    """Mixin over numba's ``CompileResultCacheImpl``: a cached CPU compile result is rebuilt as
    ``CompileResult._rebuild`` does, except that its library's linking module stays unparsed
    (``LazyLinking``) and the names it defines come from its object file."""

    def rebuild(self, target_context: Any, payload: Any) -> Any:
        libdata = payload[0]
        codegen = target_context.codegen()
        library_class = getattr(codegen, "_library_class", None)
        symbols = (
            elf_symbols(libdata[2][0])
            if isinstance(libdata, tuple)
            and len(libdata) == 3
            and libdata[1] == "object"
            and isinstance(library_class, type)
            and issubclass(library_class, CPUCodeLibrary)
            else None
        )
        if symbols is None:
            target_context.refresh()  # (numba's own loading, as numba does it)
            return super().rebuild(target_context, payload)  # type: ignore[misc]
        defined, needed = symbols
        name, _kind, (object_code, shared_bitcode) = libdata
        _libdata, fndesc, env, signature, objectmode, lifted, typeann, reload_init, envs = payload
        for init in reload_init or ():  # (a parallel loop's: its threads' symbols)
            init()
        if not _resolves(codegen, needed - defined):
            # a symbol some registry registers when imported: load them, as numba would
            target_context.refresh()
        library = codegen.create_library(name)
        library.__class__ = subclass("LazyLinking", LazyLinking, type(library))
        library._fg_bitcode = shared_bitcode
        library.enable_object_caching()
        library._set_compiled_object(object_code)
        library._finalize_final_module()
        codegen._engine._defined_symbols |= defined
        entry = target_context.get_executable(library, fndesc, env)
        result = CompileResult(
            target_context=target_context,
            typing_context=target_context.typing_context,
            library=library,
            environment=env,
            entry_point=entry,
            fndesc=fndesc,
            type_annotation=typeann,
            signature=signature,
            objectmode=objectmode,
            lifted=lifted,
            typing_error=None,
            call_helper=None,
            metadata=None,
            reload_init=reload_init,
            referenced_envs=envs,
        )
        for referenced in envs:
            library.codegen.set_env(referenced.env_name, referenced)
        return result


class FastLoading:
    """Mixin over numba's ``FunctionCache`` (CPU): loads without refreshing the target
    context's registries (the runtime is initialised, which loaded code calls), and rebuilds
    through ``LazyRebuild``."""

    _impl: Any

    def __init__(self, py_func: Any) -> None:
        super().__init__(py_func)  # type: ignore[call-arg]
        if SUPPORTED and type(self._impl) is CompileResultCacheImpl:
            self._impl.__class__ = subclass("Lazy", LazyRebuild, CompileResultCacheImpl)

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        if not (SUPPORTED and isinstance(self._impl, LazyRebuild)):
            return super().load_overload(sig, target_context)  # type: ignore[misc]
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():  # type: ignore[attr-defined]
            return self._load_overload(sig, target_context)  # type: ignore[attr-defined]


FastFunctionCache = subclass("Fast", FastLoading, FunctionCache)


def fast_load(function: Any) -> Any:
    """Give numba function ``function`` a ``FastFunctionCache`` where its cache is numba's
    plain ``FunctionCache`` (a function made inside a factory calls this itself); returns it."""
    if type(getattr(function, "_cache", None)) is FunctionCache:
        function._cache = FastFunctionCache(function.py_func)
    return function


def fast_loading(namespace: dict[str, Any]) -> None:
    """``fast_load`` every numba function defined in the module of ``namespace`` (its
    ``globals()``; functions it imports are left to their own module)."""
    module = namespace.get("__name__")
    for value in list(namespace.values()):
        py_func = getattr(value, "py_func", None)
        if py_func is not None and getattr(py_func, "__module__", None) == module:
            fast_load(value)
