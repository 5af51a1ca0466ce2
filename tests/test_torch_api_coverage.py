"""PyTorch's public names in ``torch.nn.functional``, ``torch.nn``, ``torch.optim`` and
``torch`` itself (its names that are not submodules) that fusegrad lacks are exactly those in
``tests/missing_torch_names.txt``, each under a one-line reason: a gap is deliberate, and a
name implemented later must leave the list (the test fails on stale entries too, with or
without torch)."""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import pytest

LIST = Path(__file__).resolve().parent / "missing_torch_names.txt"
MODULES = {
    "torch.nn.functional": "fusegrad.nn.functional",
    "torch.nn": "fusegrad.nn",
    "torch.optim": "fusegrad.optim",
    "torch": "fusegrad",
}


def _allow_list() -> dict[str, dict[str, str]]:
    """``[module]`` sections; ``reason: ...`` lines open a group; other lines list names."""
    listed: dict[str, dict[str, str]] = {}
    section = reason = None
    for number, raw in enumerate(LIST.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section, reason = line[1:-1], None
            assert section in MODULES, f"line {number}: unknown section {section}"
            listed.setdefault(section, {})
        elif line.startswith("reason:"):
            reason = line[len("reason:") :].strip()
            assert reason, f"line {number}: an empty reason"
        else:
            assert section is not None and reason is not None, f"line {number}: no reason"
            for name in line.split():
                assert name not in listed[section], f"{section}.{name} is listed twice"
                listed[section][name] = reason
    return listed


def _public_names(module_name: str) -> list[str]:
    """PyTorch's public names of a module: ``__all__`` where it has one (torch.optim);
    otherwise the functions and classes it defines or re-exports from torch (not typing helpers,
    imported modules or torch-function plumbing), and torch.nn's submodules; for ``torch``
    itself, every public name that is not a submodule."""
    module = importlib.import_module(module_name)
    if module_name == "torch":
        # every public name that is not a submodule: functions, classes, dtypes, constants
        # (torch's __all__ leaves out many names scripts use, such as the dtypes)
        return sorted(
            name
            for name in dir(module)
            if not name.startswith("_") and not isinstance(getattr(module, name), types.ModuleType)
        )
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    names = []
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            if module_name == "torch.nn" and obj.__name__.startswith("torch.nn."):
                names.append(name)  # torch.nn.init, torch.nn.utils, ...
            continue
        owner = getattr(obj, "__module__", None) or ""
        if not callable(obj) or not owner.startswith("torch"):
            continue  # typing helpers, constants, documentation strings
        if owner.startswith(("torch._jit_internal", "torch.overrides")) or name.startswith(
            "has_torch_function"
        ):
            continue  # TorchScript and __torch_function__ plumbing imported by the module
        if module_name == "torch.nn" and not owner.startswith("torch.nn"):
            continue
        names.append(name)
    return sorted(names)


def _has(module_name: str, name: str) -> bool:
    return hasattr(importlib.import_module(MODULES[module_name]), name)


def test_the_list_names_only_what_fusegrad_lacks() -> None:
    """Runs without torch too: every listed name is still missing (remove it when added)."""
    listed = _allow_list()
    assert set(listed) == set(MODULES)
    stale = [
        f"{section}.{name}"
        for section, names in listed.items()
        for name in names
        if _has(section, name)
    ]
    assert not stale, f"implemented now, remove from {LIST.name}: {stale}"


@pytest.mark.parametrize("module_name", list(MODULES))
def test_every_missing_torch_name_is_listed_with_a_reason(module_name: str) -> None:
    pytest.importorskip("torch")
    missing = {n for n in _public_names(module_name) if not _has(module_name, n)}
    listed = set(_allow_list().get(module_name, {}))
    unlisted = sorted(missing - listed)
    assert not unlisted, (
        f"{module_name} names fusegrad lacks that {LIST.name} does not list (implement them "
        f"or list them with a reason): {unlisted}"
    )
    unknown = sorted(listed - set(_public_names(module_name)))
    assert not unknown, f"listed but not public in {module_name} (torch changed?): {unknown}"
