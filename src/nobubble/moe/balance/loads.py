"""Per-expert loads to balance: heavy-tailed synthetic ones, ones read from a file, and the
per-GPU load of the placement without redundancy that EPLB is measured against.

Shapes: ``L`` MoE layers, ``E`` logical experts, ``G`` GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nobubble.files import read_input_text
from nobubble.moe.balance.problem import SKEW_KINDS, parse_skew
from nobubble.validation import MAX_REAL

__all__ = ["SKEW_KINDS", "expert_loads", "synthetic_loads", "read_loads", "static_gpu_loads"]


def expert_loads(num_experts: int, *, path: Path | None = None, skew: str = "zipf:1.0",
                 num_layers: int = 1, tokens: int = 100_000, seed: int = 0) -> torch.Tensor:  # fmt: skip
    """(L, E) float64 loads to balance: read from ``path`` (:func:`read_loads`, which must
    hold ``num_experts`` loads a row), else synthetic (:func:`synthetic_loads` of ``skew`` as
    :func:`~.problem.parse_skew` reads it). Raises ValueError naming the file or the skew."""
    if path is None:
        kind, param = parse_skew(skew)
        return synthetic_loads(kind, param, num_layers, num_experts, tokens, seed)
    weight = read_loads(path)
    if weight.shape[1] != num_experts:
        raise ValueError(f"{path} has {weight.shape[1]} experts per row, num_experts is "
                         f"{num_experts}; give one load per expert")  # fmt: skip
    return weight


def synthetic_loads(
    kind: str, param: float, num_layers: int, num_experts: int, tokens: int, seed: int
) -> torch.Tensor:
    """(L, E) float64 heavy-tailed loads summing to ``tokens`` per layer, experts shuffled.

    zipf: the k-th most popular expert gets ``1 / k**param``; pareto: i.i.d. Pareto(param)
    popularities (scale 1, ``numpy.random.pareto(param) + 1``).
    """
    import numpy as np

    if kind not in SKEW_KINDS:
        raise ValueError(f"kind={kind!r}: use one of {', '.join(SKEW_KINDS)}")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_layers):
        if kind == "zipf":
            with np.errstate(over="ignore"):  # a huge skew: every rank past the first is 0
                pop = rng.permutation(1.0 / np.arange(1, num_experts + 1) ** param)
        else:
            pop = rng.pareto(param, num_experts) + 1.0
        rows.append(pop / pop.sum() * tokens)
    return torch.tensor(np.stack(rows), dtype=torch.float64)


def read_loads(path: Path) -> torch.Tensor:
    """(L, E) float64 loads from ``path``: JSON (a list, or a list of lists, one per layer) or
    text with one whitespace/comma separated row per layer.

    Raises ValueError, starting with ``path``, for a file that is unreadable, not numbers,
    ragged, empty, not finite, negative, or has a row of zeros (nothing to balance).
    """
    text = read_input_text(path, "give a JSON or text file of per-expert loads")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [
                [float(x) for x in line.replace(",", " ").split()]
                for line in text.splitlines()
                if line.strip()
            ]
        except ValueError as err:
            raise ValueError(f"{path}: not JSON, and a row is not numbers ({err})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: give a JSON list of loads (or a list of lists, one "
                         f"per layer), not a {type(data).__name__}")  # fmt: skip
    if data and not isinstance(data[0], list):
        data = [data]
    try:
        weight = torch.tensor(data, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path}: rows must be numbers of equal length ({err})") from None
    if weight.numel() == 0:
        raise ValueError(f"{path}: no numbers; give one row of expert loads per layer")
    if not (weight.isfinite().all() and weight.abs().max() <= MAX_REAL):
        raise ValueError(f"{path}: a load is not a finite number (NaN, inf, 1e308)")
    if (weight < 0).any():
        raise ValueError(f"{path}: a load is negative; loads count tokens, >= 0")
    if not weight.sum(-1).gt(0).all():
        raise ValueError(f"{path}: a row's loads are all zero; nothing to balance")
    return weight


def static_gpu_loads(weight: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """``weight (L, E)`` -> ``(L, G)`` float64: experts in order, spread as evenly as possible,
    one copy each (expert ``e`` on GPU ``e * G // E``)."""
    num_layers, num_experts = weight.shape
    gpu_of = torch.arange(num_experts) * num_gpus // num_experts  # (E,)
    out = torch.zeros(num_layers, num_gpus, dtype=torch.float64)
    out.index_add_(1, gpu_of, weight.double())
    return out
