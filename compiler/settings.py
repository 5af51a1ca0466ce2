"""The compiler's process-wide settings, ``fusegrad.compiler.config`` (below the cache and the
programs, which read them)."""

from __future__ import annotations

from .codegen.interpreter import MAX_ELEMENTS


class Config:
    """Process-wide settings (``fusegrad.compiler.config``); each takes effect on the next
    backward, and programs built under other values are not reused (they are in the key)."""

    def __init__(self) -> None:
        # kernels over at most this many elements run on the precompiled interpreter instead
        # of generated code (no per-graph JIT); 0 disables the interpreter
        self.interpreter_max_elements = MAX_ELEMENTS
        # capture with symbolic sizes, so that a program serves every batch size (False:
        # concrete sizes, one capture per size vector)
        self.symbolic_sizes = True
        # walk keys whose captures are kept (least recently used first out)
        self.cache_size = 256
        # captures kept per walk key (symbolic ones with other guards, concrete ones per size)
        self.captures_per_key = 8
        # tape keys kept (the walk-free path; a key is one forward's structure and shapes)
        self.tape_cache_size = 1024
        # size vectors a program keeps prepared (shapes, iteration spaces, extern attributes)
        self.sizes_per_program = 16
        # a backward whose capture, build and first run (numba's JIT) take longer than this many
        # seconds prints one line on stderr saying what is compiling (None: never)
        self.compile_notice_s: float | None = 2.0
        # whole-step compile (``fusegrad.compile(fn)``, ``step``): recordings kept per function
        # (one per guard key: sizes, modes, Python values); past this many keys a function
        # is no longer recorded, only its backward compiled (one logged reason)
        self.step_recordings = 8
        # generated CPU kernels that wait on each other's row sums (layer norm, softmax, their
        # backwards) run as one row kernel, row by row (``passes.rows``); False: separately
        self.row_fusion = True

    # the settings ``program_key`` holds, in its order
    PROGRAM_KEY = ("interpreter_max_elements", "row_fusion")

    def program_key(self) -> tuple:
        """What of the configuration changes a program built from a graph."""
        return tuple(getattr(self, name) for name in self.PROGRAM_KEY)


config = Config()
