"""Where and how local ranks run: :class:`LaunchOptions`, checked without importing torch (the
command line builds them before it imports torch; :func:`nobubble.distributed.check_device`
checks them against this torch build and machine).
"""

from __future__ import annotations

from dataclasses import dataclass

from nobubble.distributed.context import BACKENDS
from nobubble.validation import check_value

__all__ = ["LaunchOptions"]


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """Where the ranks run (the keywords of :func:`nobubble.distributed.spawn`)."""

    device: str = "cpu"
    """``cpu`` or ``cuda`` (rank r uses ``cuda:r``)."""
    backend: str | None = None
    """torch.distributed backend; default gloo on CPU, NCCL on CUDA."""
    timeout_s: float = 120.0
    """Limit for the whole job and for every wait inside it."""
    threads_per_rank: int = 1
    """torch threads of each rank's process."""

    @property
    def local_device(self) -> str:
        """The device of the launching process itself: ``cuda`` is its first GPU."""
        return "cuda:0" if self.device == "cuda" else self.device

    def __post_init__(self) -> None:
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: nobubble runs on cpu or cuda (cuda:N)")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is unknown; use one of "
                             f"{', '.join(BACKENDS)}")  # fmt: skip
        check_value("timeout_s", self.timeout_s, "> 0")
        check_value("threads_per_rank", self.threads_per_rank, ">= 1", integer=True)
