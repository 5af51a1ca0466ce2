"""The compiler's process-wide settings, ``fusegrad.compiler.config``: the bottom of the
compiler's layers (it imports nothing of it); every other module reads them."""

from __future__ import annotations

import os

# the largest iteration space the precompiled interpreter runs (elements; larger kernels get
# generated code): ``Config.interpreter_max_elements``'s default
INTERPRETER_MAX_ELEMENTS = 1 << 16


class Config:
    """Process-wide settings (``fusegrad.compiler.config``); each takes effect on the next
    backward, and programs built under other values are not reused (they are in the key)."""

    def __init__(self) -> None:
        # kernels over at most this many elements run on the precompiled interpreter instead
        # of generated code (no per-graph JIT); 0 disables the interpreter
        self.interpreter_max_elements = INTERPRETER_MAX_ELEMENTS
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
        # a whole step recorded for a second guard key that differs only in its arguments'
        # sizes is merged with the first into one recording over symbolic sizes, which every
        # later size replays (``dynamic``: PyTorch's automatic dynamic); False: one recording
        # per size
        self.dynamic_sizes = True
        # generated CPU kernels that wait on each other's row sums (layer norm, softmax, their
        # backwards) run as one row kernel, row by row (``passes.rows``); False: separately
        self.row_fusion = True
        # a whole step whose program needs numba's JIT (nothing in the disk cache) is compiled
        # on a thread of its own while the calls replay it uncompiled (each recorded value run
        # by its eager kernel, ``mode="debug"``); the compiled program takes over at the first
        # call after it is ready (``compiler.wait_for_compiles``).  False: the call that builds
        # the program waits for the JIT.  ``FUSEGRAD_BACKGROUND_COMPILE=0`` sets False.
        self.background_compile = os.environ.get("FUSEGRAD_BACKGROUND_COMPILE", "1") != "0"
        # native segments (``codegen.native_cpu``): the programs of recorded steps and modules
        # (concrete sizes, CPU) run their steps as one numba call per run of steps that native
        # code can run, instead of one Python dispatch per step.  None (the default;
        # ``FUSEGRAD_NATIVE=auto``): a background compile goes on to them once the program of
        # steps runs compiled (numba takes about 4x as long over them: a minute for the GPT
        # step, in a worker process that leaves the slots to first programs), and when both
        # are ready the faster of the two stays (``service.Trial``, measured over the next
        # calls, its choice remembered on disk); a foreground build makes the program of
        # steps.  True (``FUSEGRAD_NATIVE=1``): every such program is built with them at once.
        # False (``FUSEGRAD_NATIVE=0``): never.  Read when a program is built.
        self.native_programs: bool | None = {"1": True, "0": False}.get(
            os.environ.get("FUSEGRAD_NATIVE", ""), None
        )
        # the quick tier (``Program.quick``): a whole step's or compiled module's program with
        # every kernel the interpreter can run interpreted, whatever its size, and the others
        # by eager kernels, so that it generates no code.  None (the default): a background
        # compile of such a program publishes its quick tier first, when the program has code to
        # generate that nobody compiled before (the calls run it while the program compiles).
        # True (``FUSEGRAD_QUICK=1``): such programs are built as their quick tier, and stay
        # so (no generated code, no native segments).  False (``FUSEGRAD_QUICK=0``): never.
        self.quick_programs: bool | None = {"1": True, "0": False}.get(
            os.environ.get("FUSEGRAD_QUICK", ""), None
        )
        # a background compile of a whole step's or a compiled module's program runs numba in
        # a worker process (``workers``): no GIL taken from the calls that run meanwhile, and
        # the disk cache is filled even when the script exits first.  False: on the compile
        # thread.  ``FUSEGRAD_COMPILE_WORKERS=0`` sets False.
        self.compile_workers = os.environ.get("FUSEGRAD_COMPILE_WORKERS", "1") != "0"
        # a ``service.Trial`` between two candidate programs (interpreted or generated larger
        # kernels; native segments) writes which one it kept into the disk cache, and the next
        # background compile of the same program in any process builds that one alone, with
        # no trial.  False: every process measures again.  ``FUSEGRAD_REMEMBER_TRIALS=0``
        # sets False.
        self.remember_trials = os.environ.get("FUSEGRAD_REMEMBER_TRIALS", "1") != "0"

    # the settings ``program_key`` holds, in its order
    PROGRAM_KEY = ("interpreter_max_elements", "row_fusion")

    def program_key(self) -> tuple:
        """What of the configuration changes a program built from a graph."""
        return tuple(getattr(self, name) for name in self.PROGRAM_KEY)


config = Config()
