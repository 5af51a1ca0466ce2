"""``fusegrad.distributed``: PyTorch's ``torch.distributed`` names on MPI (mpi4py).

Start processes with ``mpiexec -n 2 python train.py`` or ``python -m fusegrad.distributed.run
-n 2 train.py``; in each, ``init_process_group()`` joins the default group (``backend`` "mpi",
or PyTorch's "gloo"/"nccl", which are aliases: MPI is the one transport).  Collectives work on
tensors in place; CPU tensors go to MPI as their own numpy arrays, CUDA tensors through host
buffers.  ``fusegrad.nn.parallel.DistributedDataParallel`` and
``fusegrad.utils.data.DistributedSampler`` build on it.  Under ``compiled_autograd`` DDP's
hooks run at their eager positions in the compiled backward; a compiled training step
(``fusegrad.compile``) averages DDP's buckets in its program (``allreduce_start`` /
``allreduce_wait`` steps, see ``fusegrad.compiler.step``).

``fusegrad.distributed.rpc`` (``init_rpc``, ``rpc_sync``/``rpc_async``/``remote``, ``RRef``;
MPI point-to-point with a progress thread), ``fusegrad.distributed.autograd`` (a backward
across processes: ``context``, ``backward``, ``get_gradients``) and
``fusegrad.distributed.optim.DistributedOptimizer`` are imported as modules of their own, as
PyTorch's are.

Not yet here: ``all_to_all``, ``Work.get_future``, RRef reference counting,
``rpc.functions.async_execution``.
"""

from __future__ import annotations

from .collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    barrier,
    broadcast,
    broadcast_object_list,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter_tensor,
    scatter,
    send,
)
from .process_group import (
    DEFAULT_TIMEOUT,
    DistError,
    DistNotInitializedError,
    DistTimeoutError,
    GroupMember,
    ProcessGroup,
    ReduceOp,
    Work,
    cuda_aware_mpi,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    new_group,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistError",
    "DistNotInitializedError",
    "DistTimeoutError",
    "GroupMember",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "cuda_aware_mpi",
    "destroy_process_group",
    "gather",
    "get_backend",
    "get_global_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]
