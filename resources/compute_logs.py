"""The instance's compute log manager (dagster.yaml `compute_logs`): Dagster's local one, whose helper processes do
not take the terminal's Ctrl-C.

Dagster mirrors each step's stdout/stderr to the console through a `tail -F` child and a Python watcher child
(`dagster._core.execution.compute_logs.execute_posix_tail`). Both sit in the terminal's process group, so Ctrl-C
reaches them too, and the watcher prints a `KeyboardInterrupt` traceback each time. They are spawned with SIGINT
blocked (a blocked signal stays blocked across fork and exec; Python leaves it so): the interrupt goes to the
run only, which stops cleanly (cli/run.py), and Dagster ends the children with SIGTERM as it always does. A Ctrl-C
that arrives while they are being spawned is held for those microseconds, not lost.
"""
from __future__ import annotations

import signal
from collections.abc import Generator, Sequence
from contextlib import ExitStack, contextmanager

from dagster._core.storage.compute_log_manager import CapturedLogContext
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager


class QuietComputeLogManager(LocalComputeLogManager):
    """LocalComputeLogManager (same files, same UI) whose mirroring children do not receive the terminal's SIGINT."""

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> QuietComputeLogManager:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        with ExitStack() as stack:
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:  # the children are forked here and inherit the mask
                captured = stack.enter_context(super().capture_logs(log_key))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl-C held meanwhile is delivered now
            yield captured
