"""Data-parallel training over MPI: ``mpiexec -n 2 python -m benchmarks.distributed``.

For the MLP of ``benchmarks.steps`` (784-512-512-10 ReLU, SGD with momentum, global batch 512)
and its GPT (2 layers, width 64, 4 heads, block 32, vocabulary 65, dropout 0.1, AdamW, global
batch 64), three implementations.  The batches are larger than ``benchmarks.steps``' (128 and
8): there an eager step is mostly per-op overhead, which does not shrink with the batch (one
process here: the GPT's fusegrad step takes 82 ms at batch 8 and 97 ms at 16, 428 ms at 64), so
splitting the batch over processes could not speed it up; ``--mlp-batch``/``--gpt-batch``.

* ``fg eager``: fusegrad, eager backward (``DistributedDataParallel``'s hooks start each
  bucket's non-blocking allreduce as its last gradient is accumulated);
* ``fg compiled bwd``: the same inside ``fusegrad.compiler.compiled_autograd()`` (the compiled
  backward runs DDP's hooks at their eager positions, its end-of-backward wait at the end);
* ``torch (gloo)``: PyTorch's DDP on the gloo backend, when torch is importable
  (``torch.distributed`` initialised from ``MASTER_ADDR=127.0.0.1``, a free port rank 0 picks,
  and the rank and world size MPI gave).

Measured, per model and implementation:

* **step time**: zero_grad, forward, loss, backward, optimizer step, median wall time.  "1
  process" is one process training on the whole global batch without DDP (rank 0 measures it
  while the other ranks wait); "N processes" is DDP on N processes, each on 1/N of the same
  global batch (every rank measures, each step started after an untimed barrier; rank 0's
  figures are shown: the allreduces keep the ranks in step).
* **speedup** = (1-process step time) / (N-process step time): the throughput ratio at the same
  global batch (ideal: N); **efficiency** = speedup / N.
* **N alone** (the control): every process trains its own model on its share without DDP or
  any communication, all at once; **speedup alone** = 1-process time / that: what the machine
  lets N processes gain before any communication (on a machine whose cores are shared with
  other work, well below N).
* **allreduce**: the time of blocking allreduces of the same buckets (same sizes and dtype, one
  after another, after a barrier), i.e. what communication costs when nothing hides it.
  fusegrad's buckets are DDP's (``bucket_names``), torch's the ones its logging data reports.
* **exposed**: the time from the moment the last gradient is accumulated (a post-accumulate-grad
  hook on every parameter, running before DDP's own; for ``fg compiled bwd``, whose program
  does DDP's averaging itself when no other hook is there, the moment it started the last
  bucket's allreduce, ``compiler.counters.last_allreduce_start``) to ``backward()`` returning: what
  backward spends waiting for the outstanding allreduces (and copying the averages out) after
  its computation is done.  Mean over the ranks of each rank's median.
* **after all ranks**: the same, counted from the latest of the ranks' last-gradient moments in
  that step (``perf_counter`` is one monotonic clock for the processes of one machine): the
  exposed time without the wait for a slower peer, which on a busy machine dominates it.
* **overlap fraction** = 1 - (after all ranks) / allreduce, clipped to [0, 1] (with ranks on
  several machines, 1 - exposed / allreduce): the share of the communication that backward's
  computation hid.  A bucket whose last gradient comes last (the
  first layer's, or the tied embedding of the GPT) cannot be hidden at all, and MPI (MPICH
  without ``MPICH_ASYNC_PROGRESS``) progresses a non-blocking allreduce only inside MPI calls,
  so fusegrad's overlap comes from the progress made when later buckets are issued.

Threads: ``--threads N`` (default 1) sets OMP/OpenBLAS/MKL/numba threads (and torch's) in every
rank before numpy is imported; two ranks at one thread each fill a 2-core machine.  Run with
one process (``python -m benchmarks.distributed``), it reports the 1-process times and DDP on
a world of one.  ``--quick`` (tiny models, two steps) is a smoke test, not a measurement.
Output: markdown tables on rank 0's stdout and JSON (``--json``, default
``benchmarks/results/distributed.json``).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, live, models  # noqa: E402

MODELS = ("MLP", "GPT")
IMPLS = ("fg_eager", "fg_compiled", "torch")
HEADERS = {"fg_eager": "fg eager", "fg_compiled": "fg compiled bwd", "torch": "torch (gloo)"}
GPT = {"vocab": 65, "width": 64, "heads": 4, "block": 32}
BATCH = {"MLP": 512, "GPT": 64}  # global batches
QUICK_GPT = {"vocab": 11, "width": 8, "heads": 2, "block": 4, "layers": 1}
REPS = (3, 30)  # warm-up, measured steps
QUICK_REPS = (1, 2)
ALLREDUCE_REPS = 20


def _build(torch: Any, name: str, quick: bool) -> Any:
    if name == "MLP":
        nn = torch.nn
        width = 16 if quick else 512
        return nn.Sequential(
            nn.Linear(32 if quick else 784, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )
    return models.make(torch, "gpt", **(QUICK_GPT if quick else GPT))


def _batches(np: Any, name: str, batch: int, quick: bool, count: int = 4) -> list:
    """``count`` global batches (numpy), the same on every rank."""
    rng = np.random.default_rng(0)
    if name == "MLP":
        features = 32 if quick else 784
        return [
            (rng.standard_normal((batch, features)).astype(np.float32), rng.integers(0, 10, batch))
            for _ in range(count)
        ]
    sizes = QUICK_GPT if quick else GPT
    shape = (batch, sizes["block"])
    return [
        (rng.integers(0, sizes["vocab"], shape), rng.integers(0, sizes["vocab"], shape))
        for _ in range(count)
    ]


def _optimizer(torch: Any, name: str, params: Any) -> Any:
    if name == "MLP":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3)


class Impl:
    """One implementation's model (DDP-wrapped or not), optimizer and timed step."""

    def __init__(
        self,
        torch: Any,
        name: str,
        state: dict,
        data: list,
        *,
        quick: bool,
        wrap: Callable[[Any], Any] | None = None,
        context: Callable[[], Any] | None = None,
        barrier: Callable[[], Any] | None = None,
        compiled_runs: Callable[[], int] | None = None,
        last_start: Callable[[], float] | None = None,
    ) -> None:
        self.torch = torch
        model = _build(torch, name, quick)
        model.load_state_dict(copy.deepcopy(state))
        self.model = model
        self.last_grad_at = 0.0
        # a compiled backward that does DDP's averaging itself (no hook of ours in the way,
        # or it would run DDP's hooks instead) tells when it started the last bucket
        self.last_start = last_start
        # (a model with buffers to broadcast keeps DDP's hooks, and so can have ours)
        if wrap is not None and (last_start is None or any(True for _ in model.buffers())):
            # hooks first, so they run before DDP's own on each parameter
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self.net = wrap(model) if wrap is not None else model
        self.opt = _optimizer(torch, name, model.parameters())
        self.batches = [(torch.tensor(x), torch.tensor(y)) for x, y in data]
        self.context = context
        self.barrier = barrier
        self.count = 0
        self.compiled_runs = compiled_runs  # the compiler's counter of compiled backwards
        self.steps = self.compiled_steps = 0  # since prepared: steps, and those run compiled
        self.marks: list[tuple[float, float]] = []  # (last gradient, backward returned) per step

    def _grad_ready(self, p: Any) -> None:
        self.last_grad_at = common.clock()

    def step(self) -> dict[str, float]:
        x, y = self.batches[self.count % len(self.batches)]
        self.count += 1
        if self.barrier is not None:  # (untimed) the ranks start each step together
            self.barrier()
        t0 = common.clock()
        if self.last_start is not None:
            self.last_grad_at = 0.0  # (set below, or by our hook, for this step)
        self.opt.zero_grad()
        loss = models.loss(self.torch, self.net, x, y)
        t1 = common.clock()
        before = self.compiled_runs() if self.compiled_runs is not None else 0
        if self.context is not None:
            with self.context():
                loss.backward()
        else:
            loss.backward()
        t2 = common.clock()
        if self.last_start is not None and self.last_start() > t1:
            self.last_grad_at = self.last_start()
        self.steps += 1
        if self.compiled_runs is not None and self.compiled_runs() > before:
            self.compiled_steps += 1
        self.opt.step()
        t3 = common.clock()
        phases = {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2}
        if self.last_grad_at:
            phases["exposed"] = t2 - self.last_grad_at
            self.marks.append((self.last_grad_at, t2))
        return phases

    def params(self) -> list:
        return [p.detach().numpy().copy() for p in self.model.parameters()]


def _median_ms(stats: dict[str, Any], phase: str) -> float | None:
    return stats[phase].median * 1e3 if phase in stats else None


def _step_ms(stats: dict[str, Any]) -> float:
    # "total" also sums the exposed phase (a part of backward): the step is the three phases
    return (stats["forward"].median + stats["backward"].median + stats["optimizer"].median) * 1e3


def _fg_bucket_sizes(ddp: Any) -> list[tuple[int, Any]]:
    """(elements, numpy dtype) of each bucket of a fusegrad DDP, from its parameter names."""
    params = dict(ddp.module.named_parameters())
    sizes = []
    for names in ddp.bucket_names:
        sizes.append(
            (sum(params[n].numel() for n in names), params[names[0]].detach().numpy().dtype)
        )
    return sizes


def _torch_bucket_sizes(ddp: Any, np: Any) -> list[tuple[int, Any]]:
    """torch DDP's buckets (bytes in its logging data; float32 parameters)."""
    data = ddp._get_ddp_logging_data()
    text = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    sizes = [int(n) // 4 for n in re.findall(r"\d+", text)]  # "1071144, 557056"
    if not sizes:
        sizes = [sum(p.numel() for p in ddp.module.parameters())]
    return [(n, np.float32) for n in sizes]


def _allreduce_ms(
    np: Any, sizes: list[tuple[int, Any]], reduce: Callable[[Any], None], barrier: Callable
) -> float:
    """Median time of blocking allreduces of buffers of ``sizes``, one after another, each
    repetition started after a barrier."""
    buffers = [np.ones(n, dtype) for n, dtype in sizes]
    times = []
    for rep in range(ALLREDUCE_REPS + 2):
        barrier()
        t0 = common.clock()
        for buf in buffers:
            reduce(buf)
        if rep >= 2:  # two warm-up repetitions
            times.append(common.clock() - t0)
    return common.summarize(times).median * 1e3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_torch_distributed(torch: Any, dist: Any) -> Any:
    """torch.distributed on gloo with the MPI rank and world size; rank 0 picks the port."""
    import torch.distributed as tdist

    port = [_free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port[0])
    tdist.init_process_group(
        "gloo", init_method="env://", rank=dist.get_rank(), world_size=dist.get_world_size()
    )
    return tdist


def run_model(
    np: Any,
    fg: Any,
    dist: Any,
    torch: Any | None,
    tdist: Any | None,
    name: str,
    quick: bool,
    batch: int,
    bucket_cap_mb: float,
) -> dict[str, Any]:
    """Measure one model: 1 process (rank 0) then DDP on every rank; rank 0's row."""
    fc = importlib.import_module("fusegrad.compiler")
    from fusegrad.nn.parallel import DistributedDataParallel as DDP

    world, rank = dist.get_world_size(), dist.get_rank()
    if batch % world:
        raise SystemExit(f"{name}: global batch {batch} does not split over {world} processes")
    warmup, reps = QUICK_REPS if quick else REPS
    fg.manual_seed(0)
    state = {k: v.detach().clone() for k, v in _build(fg, name, quick).state_dict().items()}
    data = _batches(np, name, batch, quick)
    share = batch // world
    mine = [
        (x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share])
        for x, y in data
    ]
    tstate = None
    if torch is not None:
        tstate = {k: torch.from_numpy(v.numpy().copy()) for k, v in state.items()}

    def prepared(impls: dict[str, Impl]) -> dict[str, Impl]:
        for key, impl in impls.items():
            for _ in range(3):
                impl.step()
            if key == "fg_compiled":
                fc.wait_for_compiles()  # (compiled on a thread while the first calls ran eagerly)
            impl.steps = impl.compiled_steps = 0
            impl.marks = []
        return impls

    def compiled_runs() -> int:
        return int(fc.counters.compiled_runs)

    compiled_share: dict[str, str] = {}

    # -- one process, the whole batch (rank 0; the others wait) --------------------------------
    single: dict[str, float | None] = dict.fromkeys(IMPLS)
    if rank == 0:
        impls = {
            "fg_eager": Impl(fg, name, state, data, quick=quick),
            "fg_compiled": Impl(
                fg,
                name,
                state,
                data,
                quick=quick,
                context=fc.compiled_autograd,
                compiled_runs=compiled_runs,
            ),
        }
        if torch is not None:
            impls["torch"] = Impl(torch, name, tstate, data, quick=quick)
        stats = common.measure_interleaved(
            {k: i.step for k, i in prepared(impls).items()}, warmup=warmup, reps=reps
        )
        single.update({k: _step_ms(s) for k, s in stats.items()})
        done = impls["fg_compiled"]
        compiled_share["1 process"] = f"{done.compiled_steps}/{done.steps}"
    dist.barrier()

    # -- DDP on every process, 1/world of the batch each --------------------------------------
    def fg_ddp(module: Any) -> Any:
        return DDP(module, bucket_cap_mb=bucket_cap_mb)

    impls = {
        "fg_eager": Impl(fg, name, state, mine, quick=quick, wrap=fg_ddp, barrier=dist.barrier),
        "fg_compiled": Impl(
            fg,
            name,
            state,
            mine,
            quick=quick,
            wrap=fg_ddp,
            context=fc.compiled_autograd,
            barrier=dist.barrier,
            compiled_runs=compiled_runs,
            last_start=lambda: float(fc.counters.last_allreduce_start),
        ),
    }
    if torch is not None:

        def torch_ddp(module: Any) -> Any:
            return torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)

        impls["torch"] = Impl(
            torch, name, tstate, mine, quick=quick, wrap=torch_ddp, barrier=dist.barrier
        )
    stats = common.measure_interleaved(
        {k: i.step for k, i in prepared(impls).items()}, warmup=warmup, reps=reps
    )
    # the control: every process trains alone on its share (no DDP, no communication), all at
    # once: what the machine allows N processes to do, communication apart
    control: dict[str, Impl] = {
        "fg_eager": Impl(fg, name, state, mine, quick=quick, barrier=dist.barrier),
        "fg_compiled": Impl(
            fg, name, state, mine, quick=quick, context=fc.compiled_autograd, barrier=dist.barrier
        ),
    }
    if torch is not None:
        control["torch"] = Impl(torch, name, tstate, mine, quick=quick, barrier=dist.barrier)
    alone_stats = common.measure_interleaved(
        {k: i.step for k, i in prepared(control).items()}, warmup=warmup, reps=reps
    )
    alone = {k: _step_ms(st) for k, st in alone_stats.items()}
    # blocking allreduces of each implementation's buckets
    fg_sizes = _fg_bucket_sizes(impls["fg_eager"].net)

    def fg_reduce(buf: Any) -> None:
        dist.all_reduce(fg.from_numpy(buf))

    allreduce = {k: _allreduce_ms(np, fg_sizes, fg_reduce, dist.barrier) for k in IMPLS[:2]}
    buckets = {k: len(fg_sizes) for k in IMPLS[:2]}
    if torch is not None:
        t_sizes = _torch_bucket_sizes(impls["torch"].net, np)

        def torch_reduce(buf: Any) -> None:
            tdist.all_reduce(torch.from_numpy(buf))

        allreduce["torch"] = _allreduce_ms(np, t_sizes, torch_reduce, dist.barrier)
        buckets["torch"] = len(t_sizes)
    # every rank's exposed time; rank 0's step times
    exposed_mine = {k: _median_ms(s, "exposed") for k, s in stats.items()}
    every: list[Any] = [None] * world
    dist.all_gather_object(every, exposed_mine)
    # the part of it after the last gradient of *every* rank: step i is the same step on every
    # rank, and perf_counter is CLOCK_MONOTONIC, one clock for the processes of one machine
    marks: list[Any] = [None] * world
    dist.all_gather_object(marks, (socket.gethostname(), {k: i.marks for k, i in impls.items()}))
    one_machine = len({host for host, _ in marks}) == 1
    after_all: dict[str, float | None] = dict.fromkeys(impls)
    if one_machine:
        for key in impls:
            per_rank = []
            steps = min(len(m[1][key]) for m in marks)
            if not steps:
                continue  # (no step of this implementation had a last-gradient moment)
            for r in range(world):
                waits = []
                for i, (_, end) in enumerate(marks[r][1][key][:steps]):
                    latest = max(m[1][key][i][0] for m in marks)
                    waits.append(max(0.0, end - latest))
                per_rank.append(common.summarize(waits).median * 1e3)
            after_all[key] = sum(per_rank) / world
    # replicas agree after the run (DDP kept them equal)
    replicas: list[Any] = [None] * world
    dist.all_gather_object(replicas, {k: i.params() for k, i in impls.items()})
    checks = {
        k: max(
            float(np.max(np.abs(a - b)))
            for other in replicas[1:]
            for a, b in zip(replicas[0][k], other[k])
        )
        if world > 1
        else 0.0
        for k in impls
    }
    done = impls["fg_compiled"]
    compiled_share["DDP"] = f"{done.compiled_steps}/{done.steps}"
    row: dict[str, Any] = {
        "model": name,
        "global_batch": batch,
        "per_process_batch": share,
        "fg_compiled_backwards_run_compiled": compiled_share,
    }
    for key in IMPLS:
        if key not in stats:
            continue
        s = stats[key]
        exposed = sum(e[key] for e in every) / world
        ddp_ms = _step_ms(s)
        speedup = common.ratio(single[key], ddp_ms)
        overlap = None
        unhidden = after_all[key] if after_all[key] is not None else exposed
        if allreduce[key] > 0:
            overlap = min(1.0, max(0.0, 1.0 - unhidden / allreduce[key]))
        row[key] = {
            "single_step_ms": single[key],
            "ddp_step_ms": ddp_ms,
            "alone_step_ms": alone[key],
            "alone_speedup": common.ratio(single[key], alone[key]),
            "speedup": speedup,
            "efficiency": speedup / world if speedup is not None else None,
            "ddp_forward_ms": _median_ms(s, "forward"),
            "ddp_backward_ms": _median_ms(s, "backward"),
            "ddp_optimizer_ms": _median_ms(s, "optimizer"),
            "buckets": buckets[key],
            "allreduce_ms": allreduce[key],
            "exposed_ms": exposed,
            "exposed_ms_per_rank": [e[key] for e in every],
            "exposed_after_all_ranks_ms": after_all[key],
            "overlap_fraction": overlap,
            "replica_max_abs_difference": checks[key],
        }
    return row


def step_table(rows: list[dict[str, Any]], world: int) -> str:
    headers = [
        "model",
        "global batch",
        "implementation",
        "1 process (ms)",
        f"{world} processes (ms)",
        "speedup",
        "efficiency",
        f"{world} alone (ms)",
        "speedup alone",
    ]
    body = []
    for row in rows:
        for key in IMPLS:
            r = row.get(key)
            if r is None:
                continue
            body.append(
                [
                    row["model"],
                    str(row["global_batch"]),
                    HEADERS[key],
                    common.format_number(r["single_step_ms"]),
                    common.format_number(r["ddp_step_ms"]),
                    common.format_number(r["speedup"], 2) + "×",
                    f"{r['efficiency'] * 100:.0f}%" if r["efficiency"] is not None else "—",
                    common.format_number(r["alone_step_ms"]),
                    common.format_number(r["alone_speedup"], 2) + "×",
                ]
            )
    return common.markdown_table(headers, body, ["l", "r", "l"] + ["r"] * 6)


def comm_table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "model",
        "implementation",
        "buckets",
        "backward (ms)",
        "allreduce (ms)",
        "exposed (ms)",
        "after all ranks (ms)",
        "overlap",
    ]
    body = []
    for row in rows:
        for key in IMPLS:
            r = row.get(key)
            if r is None:
                continue
            body.append(
                [
                    row["model"],
                    HEADERS[key],
                    str(r["buckets"]),
                    common.format_number(r["ddp_backward_ms"]),
                    common.format_number(r["allreduce_ms"]),
                    common.format_number(r["exposed_ms"]),
                    common.format_number(r["exposed_after_all_ranks_ms"]),
                    f"{r['overlap_fraction'] * 100:.0f}%"
                    if r["overlap_fraction"] is not None
                    else "—",
                ]
            )
    return common.markdown_table(headers, body, ["l", "l"] + ["r"] * 6)


DEFINITIONS = {
    "speedup": "1-process step time (whole global batch, no DDP) / N-process DDP step time "
    "(1/N of the batch each): the throughput ratio at the same global batch; ideal N",
    "efficiency": "speedup / N",
    "N alone": "the control: every process trains its own model on its 1/N of the batch, "
    "without DDP or any communication, all at once (each step after an untimed barrier); "
    "'speedup alone' = 1-process step time / that: what the machine lets N processes gain "
    "before communication (below N: they compete for cores or memory bandwidth)",
    "allreduce": "median time of blocking allreduces of the implementation's DDP buckets (same "
    "sizes and dtype, one after another, started after a barrier)",
    "exposed": "backward() return time minus the time this rank's last gradient was accumulated "
    "(a post-accumulate-grad hook on every parameter, before DDP's; for fg compiled bwd, when "
    "its program started the last bucket's allreduce): what backward waits after "
    "its own computation, for the allreduces, for a slower peer to join them, and to copy the "
    "averages out; per rank the median over steps, then the mean over ranks",
    "after all ranks": "backward() return time minus the latest last-gradient time over all "
    "ranks in the same step (one machine: one monotonic clock): the exposed time without the "
    "wait for a slower peer, i.e. the communication left after every rank's computation",
    "overlap_fraction": "1 - (after all ranks) / allreduce, clipped to [0, 1] (1 - exposed / "
    "allreduce when the ranks are on several machines): the share of the communication hidden "
    "behind backward's computation",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__)
    parser.add_argument("--threads", type=int, default=1, help="threads per process (default 1)")
    parser.add_argument("--quick", action="store_true", help="tiny models, 1+2 steps: smoke test")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--mlp-batch", type=int, default=BATCH["MLP"], help="global batch")
    parser.add_argument("--gpt-batch", type=int, default=BATCH["GPT"], help="global batch")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--json", type=Path, default=common.RESULTS_DIR / "distributed.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if not names or any(n not in MODELS for n in names):
        parser.error(f"--models: choose from {','.join(MODELS)}, got {args.models!r}")
    threads = common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg
    import fusegrad.distributed as dist

    dist.init_process_group("mpi")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch = tdist = None
    if not args.no_torch:
        try:
            import torch  # (optional comparison)
        except ImportError:
            torch = None
        else:
            common.pin_torch_threads(torch, args.threads)
            tdist = init_torch_distributed(torch, dist)

    def say(line: str = "") -> None:
        if rank == 0:
            live.emit(line)

    environment = common.environment(threads=args.threads)
    say(
        "# data-parallel training over MPI"
        + (" (QUICK: smoke test, not a measurement)" if args.quick else "")
    )
    say()
    say(f"machine: {common.describe_environment(environment)}")
    warmup, reps = QUICK_REPS if args.quick else REPS
    say(
        f"processes: {world} (mpiexec), {args.threads} thread(s) each (OMP/OpenBLAS/MKL/numba"
        f"{'/torch' if torch is not None else ''} threads set before numpy is imported); "
        f"DDP bucket_cap_mb {args.bucket_cap_mb:g}; {warmup} warm-up + {reps} measured steps; "
        f"torch: {'not used' if torch is None else torch.__version__ + ' DDP on gloo'}"
    )
    say("Times: medians in ms. " + " ".join(f"{k}: {v}." for k, v in DEFINITIONS.items()))
    say()
    batches = {"MLP": args.mlp_batch, "GPT": args.gpt_batch}
    rows = []
    for name in names:
        if rank == 0:
            print(f"[{name}] measuring", file=sys.stderr, flush=True)
        rows.append(
            run_model(
                np, fg, dist, torch, tdist, name, args.quick, batches[name], args.bucket_cap_mb
            )
        )
    say("## Step time: 1 process on the whole batch vs DDP")
    say()
    say(step_table(rows, world))
    say()
    say("## Allreduce and overlap with backward (DDP)")
    say()
    say(comm_table(rows))
    say()
    for row in rows:
        diffs = ", ".join(
            f"{HEADERS[k]} {row[k]['replica_max_abs_difference']:.1e}" for k in IMPLS if k in row
        )
        say(f"{row['model']}: parameters after the run, max |difference| between ranks: {diffs}")
        shares = ", ".join(f"{k} {v}" for k, v in row["fg_compiled_backwards_run_compiled"].items())
        say(f"{row['model']}: fg compiled bwd, backwards that ran compiled (rank 0): {shares}")
    if rank == 0:
        payload = {
            "benchmark": "distributed",
            "quick": args.quick,
            "world_size": world,
            "threads": threads,
            "bucket_cap_mb": args.bucket_cap_mb,
            "implementations": [k for k in IMPLS if any(k in r for r in rows)],
            "columns": dict(HEADERS),
            "definitions": DEFINITIONS,
            "rows": rows,
            "environment": environment,
        }
        path = common.write_json(args.json, payload)
        say(f"\nJSON written to {path}")
    if tdist is not None:
        tdist.destroy_process_group()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
