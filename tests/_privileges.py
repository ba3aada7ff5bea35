"""Permission bits that bind a test's child process even when the suite runs as root (CI does):
root's DAC capabilities would let it read and write whatever the test made read-only."""

from __future__ import annotations

import ctypes
import os

_LIBC = ctypes.CDLL(None, use_errno=True)  # bound before any fork: preexec_fn only calls it
_PR_CAPBSET_DROP = 24
_DAC_CAPS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def drop_dac() -> None:
    """preexec_fn: make permission bits bind this child even when it runs as root."""
    if os.geteuid() != 0:
        return
    for cap in _DAC_CAPS:
        if _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
