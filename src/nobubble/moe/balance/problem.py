"""A placement problem and its checks, without torch: what :mod:`.eplb` can place.

The command line (``nobubble ep balance``) runs these before it imports torch or makes any
loads, so that a placement EPLB cannot do is refused at once; :mod:`.eplb`,
:mod:`.incremental` and :mod:`.report` run the same checks.
"""

from __future__ import annotations

from typing import Literal

from nobubble.validation import MAX_REAL, finite

__all__ = ["Policy", "resolve_policy", "check_config", "check_synthetic", "parse_skew", "SKEW_KINDS",
           "MAX_SLOTS"]  # fmt: skip

Policy = Literal["auto", "hierarchical", "global"]
MAX_SLOTS = 10_000_000
"""Most layers x physical experts one run places: EPLB's packing is a Python loop over them
(about a microsecond each), and the report holds every slot."""
SKEW_KINDS = ("zipf", "pareto")
"""The heavy tails of synthetic loads (:func:`~.loads.synthetic_loads`)."""


def parse_skew(text: str) -> tuple[str, float]:
    """``"zipf:1.2"`` -> ``("zipf", 1.2)``: a heavy tail of :data:`SKEW_KINDS` and its
    parameter (Zipf's exponent S, Pareto's tail index A); ValueError naming the forms."""
    kind, _, value = text.partition(":")
    try:
        param = float(value)
    except ValueError:
        param = float("nan")
    if kind not in SKEW_KINDS or not (finite(param) and param > 0):
        raise ValueError(f"skew={text!r}: use zipf:S or pareto:A with a finite number > 0")
    return kind, param


def resolve_policy(policy: str, num_groups: int, num_nodes: int) -> str:
    """Turn ``policy`` ("auto", "hierarchical", "global") into the one that will run.

    "auto" is hierarchical when ``num_groups % num_nodes == 0`` (EPLB's rule) and global when
    ``num_groups == 1``; other group counts raise instead of silently ignoring the groups.
    """
    if policy not in ("auto", "hierarchical", "global"):
        raise ValueError(f"policy={policy!r}: use 'auto', 'hierarchical' or 'global'")
    if policy == "global":
        return "global"
    if num_groups % num_nodes == 0:
        return "hierarchical"
    if policy == "auto" and num_groups == 1:
        return "global"
    raise ValueError(
        f"num_groups={num_groups} is not a multiple of num_nodes={num_nodes}: the hierarchical "
        "policy keeps each expert group on one node; pick a group count divisible by the "
        "node count, or policy='global' to ignore the groups"
    )


def check_config(
    num_logical_experts: int,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    policy: str = "auto",
) -> str:
    """Validate a placement problem; returns the policy that will run. Raises ValueError."""
    for name, value in (
        ("num_logical_experts", num_logical_experts),
        ("num_replicas", num_replicas),
        ("num_groups", num_groups),
        ("num_nodes", num_nodes),
        ("num_gpus", num_gpus),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if num_gpus % num_nodes:
        raise ValueError(
            f"num_gpus={num_gpus} is not a multiple of num_nodes={num_nodes}: every node needs "
            "the same number of GPUs"
        )
    if num_replicas % num_gpus:
        raise ValueError(
            f"num_replicas={num_replicas} is not a multiple of num_gpus={num_gpus}: every GPU "
            f"holds the same number of physical experts; use a multiple of {num_gpus}"
        )
    if num_replicas < num_logical_experts:
        raise ValueError(
            f"num_replicas={num_replicas} is fewer than the {num_logical_experts} logical "
            "experts: every expert needs at least one replica"
        )
    if num_logical_experts % num_groups:
        raise ValueError(
            f"num_logical_experts={num_logical_experts} is not a multiple of "
            f"num_groups={num_groups}: groups must be of equal size"
        )
    resolved = resolve_policy(policy, num_groups, num_nodes)
    nodes = num_nodes if resolved == "hierarchical" else 1
    per_gpu, per_node = num_replicas // num_gpus, num_logical_experts // nodes
    if per_gpu > per_node:
        raise ValueError(
            f"each GPU holds {per_gpu} physical experts but its node has only {per_node} "
            "logical experts, so some GPU would hold one expert twice; use fewer replicas "
            f"(at most {per_node * num_gpus})"
        )
    return resolved


def check_synthetic(num_experts: int, num_redundant: int, num_layers: int, tokens: float,
                    skew: str, *, force: bool = False) -> None:  # fmt: skip
    """Refuse synthetic loads :func:`~nobubble.moe.balance.loads.expert_loads` cannot draw
    (a bad ``skew``, ``tokens`` past any real count) or a problem of more than
    :data:`MAX_SLOTS` layer x physical expert placements (unless ``force``): ValueError."""
    parse_skew(skew)
    if not finite(tokens):
        raise ValueError(f"--tokens {tokens}: past {MAX_REAL:g}, not a count of tokens")
    slots = num_layers * (num_experts + num_redundant)
    if slots > MAX_SLOTS and not force:
        raise ValueError(
            f"ep balance: --layers {num_layers:,} x {num_experts + num_redundant:,} physical "
            f"experts = {slots:,} placements, past the budget of {MAX_SLOTS:,}; use fewer, or "
            "--force"
        )
