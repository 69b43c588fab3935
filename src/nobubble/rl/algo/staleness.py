"""Policy-lag control: a sample's lag (the learner's version minus the one that generated it),
its soft weight (the hard cut, lag > ``max_staleness``, is the system's admission rule), and
GRPO's one policy version per group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args, overload

import torch

__all__ = [
    "StalenessKind",
    "policy_lag",
    "staleness_weight",
    "check_group_versions",
]

StalenessKind = Literal["inverse", "exp", "none"]
_KINDS = get_args(StalenessKind)


def _as_versions(versions: Sequence[int] | torch.Tensor) -> torch.Tensor:
    v = torch.as_tensor(versions)
    if v.dim() != 1 or v.dtype.is_floating_point:
        raise ValueError(
            f"policy versions must be a 1-D sequence of ints, got shape {tuple(v.shape)} "
            f"dtype {v.dtype}"
        )
    return v.to(torch.int64)


def policy_lag(versions: Sequence[int] | torch.Tensor, current_version: int) -> torch.Tensor:
    """``current_version - versions`` as int64 ``(N,)``; ValueError where a sample claims a
    version newer than the learner's."""
    lag = current_version - _as_versions(versions)
    if lag.numel() and lag.min().item() < 0:
        newest = current_version - lag.min().item()
        raise ValueError(
            f"policy_lag: a sample has policy_version={newest} > current_version="
            f"{current_version}; versions must come from weights the learner already published"
        )
    return lag


@overload
def staleness_weight(
    gap: torch.Tensor, kind: StalenessKind = ..., *, half_life: float = ...
) -> torch.Tensor: ...
@overload
def staleness_weight(gap: float, kind: StalenessKind = ..., *, half_life: float = ...) -> float: ...


def staleness_weight(
    gap: float | torch.Tensor, kind: StalenessKind = "inverse", *, half_life: float = 1.0
) -> float | torch.Tensor:
    """Weight of a gradient or sample ``gap`` policy versions old (a float for a float, a float
    tensor for a tensor): ``"inverse"``: ``1 / (1 + gap)`` (gap 0, 1, 3 -> 1, 1/2, 1/4);
    ``"exp"``: ``0.5 ** (gap / half_life)``; ``"none"``: 1."""
    if kind not in _KINDS:
        raise ValueError(f"staleness_weight: kind={kind!r}; use one of {_KINDS}")
    if half_life <= 0:
        raise ValueError(f"staleness_weight: half_life={half_life} must be > 0")
    g = gap if isinstance(gap, torch.Tensor) else torch.tensor(float(gap), dtype=torch.float64)
    g = g if g.is_floating_point() else g.to(torch.get_default_dtype())
    if g.numel() and g.min().item() < 0:
        raise ValueError(
            f"staleness_weight: gap={g.min().item()} must be >= 0 (current - sample version)"
        )
    if kind == "none":
        w = torch.ones_like(g)
    else:
        w = 1.0 / (1.0 + g) if kind == "inverse" else torch.pow(0.5, g / half_life)
    return w if isinstance(gap, torch.Tensor) else float(w)


def check_group_versions(versions: Sequence[int] | torch.Tensor, group_size: int) -> torch.Tensor:
    """Each GRPO group's one policy version, int64 ``(G,)``, from ``versions`` ``(G *
    group_size,)`` (a group's responses adjacent); ValueError names the first mixed group."""
    v = _as_versions(versions)
    if group_size < 1 or v.numel() % group_size != 0:
        raise ValueError(
            f"check_group_versions: group_size={group_size} must be >= 1 and divide "
            f"{v.numel()} samples"
        )
    groups = v.reshape(-1, group_size)  # (G, group_size)
    mixed = (groups != groups[:, :1]).any(dim=1)
    if mixed.any():
        g = int(mixed.nonzero()[0].item())
        raise ValueError(
            f"check_group_versions: group {g} mixes policy versions "
            f"{sorted(set(groups[g].tolist()))}; generate all responses of a prompt with one "
            "policy version (pause weight updates per group, or drop the group)"
        )
    return groups[:, 0].clone()
