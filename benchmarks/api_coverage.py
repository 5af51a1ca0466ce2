"""API coverage: how much of PyTorch's public API fusegrad has, namespace by namespace.

For each namespace below, PyTorch's public callables and classes are listed (``public_names``)
and each is looked up in fusegrad's counterpart.  A name fusegrad leaves out on purpose
(deprecated, quantized, TorchScript, vendor-specific, internal) is listed with its reason in
``tests/missing_torch_names.txt`` (``exclusions``) and counts as covered; every other name
fusegrad lacks is printed as missing.  ``tests/test_torch_api_coverage.py`` keeps the list
honest (no listed name may exist in fusegrad, every listed name must exist in torch) and runs
``--quick``.

Run from the repository root (PyTorch must be importable; without it the report says so and
exits 0, since there is nothing to compare against)::

    python -m benchmarks.api_coverage [--quick] [--json PATH] [--check]

``--quick`` prints the table only (no list of missing names); ``--check`` exits 1 when a
namespace with a target in ``TARGETS`` is below it.  Nothing here is timed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
EXCLUSIONS = REPO_ROOT / "tests" / "missing_torch_names.txt"

# PyTorch namespace -> fusegrad counterpart ("fusegrad.Tensor": the class's attributes)
NAMESPACES: dict[str, str] = {
    "torch": "fusegrad",
    "torch.Tensor": "fusegrad.Tensor",
    "torch.nn": "fusegrad.nn",
    "torch.nn.functional": "fusegrad.nn.functional",
    "torch.linalg": "fusegrad.linalg",
    "torch.fft": "fusegrad.fft",
    "torch.special": "fusegrad.special",
    "torch.distributions": "fusegrad.distributions",
    "torch.func": "fusegrad.func",
    "torch.autograd": "fusegrad.autograd",
    "torch.optim": "fusegrad.optim",
    "torch.optim.lr_scheduler": "fusegrad.optim.lr_scheduler",
    "torch.utils.data": "fusegrad.utils.data",
}

# coverage (present + reasoned exclusions, in percent) each namespace must reach (issue 28)
TARGETS: dict[str, float] = {
    "torch.nn.functional": 95.0,
    "torch.nn": 95.0,
    "torch.Tensor": 85.0,
    "torch": 80.0,
    "torch.optim": 100.0,
    # (issue 29: the mathematical surface)
    "torch.linalg": 100.0,
    "torch.fft": 100.0,
    "torch.special": 100.0,
    "torch.func": 100.0,
    "torch.distributions": 90.0,
}


def exclusions(path: Path = EXCLUSIONS) -> dict[str, dict[str, str]]:
    """The reasoned exclusion list: ``{namespace: {name: reason}}``.

    Format: ``[namespace]`` section lines; ``reason: ...`` lines open a group; other lines list
    the group's names, separated by spaces; ``#`` starts a comment line."""
    listed: dict[str, dict[str, str]] = {}
    section = reason = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section, reason = line[1:-1], None
            if section not in NAMESPACES:
                raise ValueError(f"{path.name}:{number}: unknown section [{section}]")
            listed.setdefault(section, {})
        elif line.startswith("reason:"):
            reason = line[len("reason:") :].strip()
            if not reason:
                raise ValueError(f"{path.name}:{number}: an empty reason")
        else:
            if section is None or reason is None:
                raise ValueError(f"{path.name}:{number}: names before a section and a reason")
            for name in line.split():
                if name in listed[section]:
                    raise ValueError(f"{path.name}:{number}: {section}.{name} is listed twice")
                listed[section][name] = reason
    return listed


def public_names(namespace: str) -> list[str]:
    """PyTorch's public callables and classes of ``namespace`` (torch must be importable).

    * ``torch``: every public name that is not a submodule (functions, classes, dtypes and
      constants: torch's ``__all__`` leaves out many names scripts use, such as the dtypes);
    * ``torch.Tensor``: every public attribute of the class (methods and properties);
    * a module with a non-empty ``__all__``: its public entries;
    * any other module: the callables it defines or re-exports from torch (not typing helpers,
      constants, TorchScript or ``__torch_function__`` plumbing), plus its own submodules
      (``torch.nn.init``, ``torch.nn.utils``, ...)."""
    if namespace == "torch.Tensor":
        import torch

        return sorted(n for n in dir(torch.Tensor) if not n.startswith("_"))
    module = importlib.import_module(namespace)
    if namespace == "torch":
        return sorted(
            name
            for name in dir(module)
            if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
        )
    declared = [n for n in getattr(module, "__all__", None) or () if not n.startswith("_")]
    if declared:
        return sorted(set(declared))
    names = []
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            if obj.__name__.startswith(namespace + "."):
                names.append(name)  # its own submodules
            continue
        owner = getattr(obj, "__module__", None) or ""
        if not callable(obj) or not owner.startswith("torch"):
            continue  # typing helpers, constants, documentation strings
        if owner.startswith(("torch._jit_internal", "torch.overrides")) or name.startswith(
            "has_torch_function"
        ):
            continue  # TorchScript and __torch_function__ plumbing imported by the module
        if namespace == "torch.nn" and not owner.startswith("torch.nn"):
            continue
        names.append(name)
    return sorted(names)


def fusegrad_object(namespace: str) -> object | None:
    """fusegrad's counterpart of ``namespace`` (None where fusegrad has no such module)."""
    target = NAMESPACES[namespace]
    if target == "fusegrad.Tensor":
        import fusegrad

        return fusegrad.Tensor
    try:
        return importlib.import_module(target)
    except ImportError:
        return None


def has_name(namespace: str, name: str) -> bool:
    obj = fusegrad_object(namespace)
    return obj is not None and hasattr(obj, name)


@dataclass
class Row:
    namespace: str
    total: int
    present: int
    excluded: int
    missing: list[str] = field(default_factory=list)

    @property
    def covered_percent(self) -> float:
        return 100.0 * (self.present + self.excluded) / self.total if self.total else 100.0

    @property
    def present_percent(self) -> float:
        return 100.0 * self.present / self.total if self.total else 100.0


def coverage(namespaces: Sequence[str] = tuple(NAMESPACES)) -> list[Row]:
    listed = exclusions()
    rows = []
    for namespace in namespaces:
        names = public_names(namespace)
        excluded = listed.get(namespace, {})
        present = [n for n in names if has_name(namespace, n)]
        missing = [n for n in names if n not in excluded and not has_name(namespace, n)]
        rows.append(
            Row(namespace, len(names), len(present), len(names) - len(present) - len(missing))
        )
        rows[-1].missing = missing
    return rows


def table(rows: Sequence[Row]) -> str:
    header = "| namespace | torch names | fusegrad has | excluded | missing | covered | target |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        target = TARGETS.get(r.namespace)
        mark = (
            ""
            if target is None
            else f"{target:.0f}%" + (" ok" if r.covered_percent >= target else " below")
        )
        lines.append(
            f"| {r.namespace} | {r.total} | {r.present} ({r.present_percent:.0f}%) | "
            f"{r.excluded} | {len(r.missing)} | {r.covered_percent:.1f}% | {mark} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.api_coverage",
        description="How many of PyTorch's public names fusegrad has, per namespace.",
    )
    parser.add_argument("--quick", action="store_true", help="the table only, no missing names")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this path")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a namespace is below its target"
    )
    args = parser.parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        print("api_coverage: PyTorch is not importable; nothing to compare against")
        return 0
    import torch

    rows = coverage()
    print(f"fusegrad API coverage against torch {torch.__version__} (covered = fusegrad has it")
    print(f"or {EXCLUSIONS.relative_to(REPO_ROOT)} excludes it with a reason)\n")
    print(table(rows))
    if not args.quick:
        for r in rows:
            if r.missing:
                print(f"\n{r.namespace}: {len(r.missing)} missing")
                print("  " + " ".join(r.missing))
    if args.json is not None:
        payload = [
            {**asdict(r), "covered_percent": r.covered_percent, "target": TARGETS.get(r.namespace)}
            for r in rows
        ]
        args.json.write_text(json.dumps(payload, indent=1))
    below = [
        r.namespace
        for r in rows
        if r.namespace in TARGETS and r.covered_percent < TARGETS[r.namespace]
    ]
    if below:
        print(f"\nbelow target: {', '.join(below)}")
    return 1 if args.check and below else 0


if __name__ == "__main__":
    sys.exit(main())
