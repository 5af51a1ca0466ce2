"""Compiler logging: ``FUSEGRAD_LOGS=graph,fusion,output_code,recompiles,cache,perf,fallback``
(or ``all``), or ``set_logs("graph,cache")``, turns on the named channels of the
``fusegrad.compiler`` logger.

Events that repeat on every step of a steady training loop (a program cache hit, the same
fallback reason) go through ``log_counted``: the first one is printed, then the 10th, 100th,
1,000th, ... with the count, so a long run with ``FUSEGRAD_LOGS=all`` is not flooded.  The
environment variable is read when this module is imported (the first compile): a channel name it
does not know is warned about and ignored, where ``set_logs`` called in code raises.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import Counter

CHANNELS = ("graph", "fusion", "output_code", "recompiles", "cache", "perf", "fallback")
logger = logging.getLogger("fusegrad.compiler")
_enabled: set[str] = set()
# how many times each (channel, key) of ``log_counted`` happened while its channel was on;
# cleared by ``set_logs``.  A lock, because several threads may compile and run at once.
_counts: Counter[tuple[str, str]] = Counter()
_counts_lock = threading.Lock()


def _parse(spec: str | None) -> tuple[set[str], set[str]]:
    """The known and the unknown channel names in the comma-separated ``spec``."""
    names = {s.strip() for s in (spec or "").split(",") if s.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(CHANNELS)
    return names & set(CHANNELS), names - set(CHANNELS)


def set_logs(spec: str | None) -> None:
    """Enable the comma-separated channels in ``spec`` ("all" for every one); None clears.

    An unknown channel raises ``ValueError`` (naming the valid ones) and changes nothing.
    Counts of repeated events (``log_counted``) start again from zero.
    """
    names, unknown = _parse(spec)
    if unknown:
        raise ValueError(f"unknown log channels {sorted(unknown)}; choose from {CHANNELS}")
    _enable(names)


def _enable(names: set[str]) -> None:
    global _enabled
    _enabled = names
    with _counts_lock:
        _counts.clear()
    if names and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[fusegrad.%(channel)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _set_logs_from_environment() -> None:
    """``FUSEGRAD_LOGS``: as ``set_logs``, but an unknown channel warns and is left out (a typo
    in an environment variable should not stop a training run at its first compile)."""
    spec = os.environ.get("FUSEGRAD_LOGS")
    names, unknown = _parse(spec)
    if unknown:
        warnings.warn(
            f"FUSEGRAD_LOGS={spec!r}: unknown log channels {sorted(unknown)} ignored; "
            f"the channels are {', '.join(CHANNELS)} (or all)",
            stacklevel=2,
        )
    _enable(names)


def enabled(channel: str) -> bool:
    return channel in _enabled


def log(channel: str, message: str) -> None:
    if channel in _enabled:
        logger.info(message, extra={"channel": channel})


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


def log_counted(channel: str, key: str, message: str) -> None:
    """Log an event that may repeat every step: count it under ``key``, and print ``message``
    the 1st, 10th, 100th, ... time, with the count.  Nothing is counted while ``channel`` is
    off."""
    if channel not in _enabled:
        return
    with _counts_lock:
        _counts[channel, key] += 1
        count = _counts[channel, key]
    if count == 1:
        text = f"{message} (repeats are counted: logged again at the 10th, 100th, ...)"
    elif _is_power_of_ten(count):
        text = f"{message} (the {count:,}th time)"
    else:
        return
    logger.info(text, extra={"channel": channel})


_set_logs_from_environment()
