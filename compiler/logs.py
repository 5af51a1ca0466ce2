"""Compiler logging: ``FUSEGRAD_LOGS=graph,fusion,output_code,recompiles,cache,perf`` (or
``set_logs("graph,cache")``) turns on the named channels of the ``fusegrad.compiler`` logger."""

from __future__ import annotations

import logging
import os

CHANNELS = ("graph", "fusion", "output_code", "recompiles", "cache", "perf", "fallback")
logger = logging.getLogger("fusegrad.compiler")
_enabled: set[str] = set()


def set_logs(spec: str | None) -> None:
    """Enable the comma-separated channels in ``spec`` ("all" for every one); None clears."""
    global _enabled
    names = {s.strip() for s in (spec or "").split(",") if s.strip()}
    if "all" in names:
        names = set(CHANNELS)
    unknown = names - set(CHANNELS)
    if unknown:
        raise ValueError(f"unknown log channels {sorted(unknown)}; choose from {CHANNELS}")
    _enabled = names
    if names and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[fusegrad.%(channel)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def enabled(channel: str) -> bool:
    return channel in _enabled


def log(channel: str, message: str) -> None:
    if channel in _enabled:
        logger.info(message, extra={"channel": channel})


set_logs(os.environ.get("FUSEGRAD_LOGS"))
