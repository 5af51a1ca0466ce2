"""fusegrad benchmarks: workloads timed against plain numpy and PyTorch.

Each benchmark is a module runnable as ``python -m benchmarks.<name>`` from the repository root;
shared machinery (thread pinning, timing, table printing, JSON results) lives in
``benchmarks.common``.  Nothing here is imported by ``fusegrad`` itself.
"""
