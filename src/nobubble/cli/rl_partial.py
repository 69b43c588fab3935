"""``nobubble rl train``'s flags for in-flight weight updates (partial rollouts).

``--partial-rollouts`` makes the generators take new weights between tokens, not only
between groups (PipelineRL, AReaL); each token records the version that produced it and the
trainer weights and drops by each token's own staleness
(:mod:`nobubble.rl.system.partial`). ``--weight-check-every N`` looks for new weights every
N tokens; ``--token-delay S`` slows every decoding step, so that one generation spans
trainer steps (the case the mode is for).
"""

from __future__ import annotations

import argparse
from typing import Any

from nobubble.cli.util import nonneg_float, positive_int

__all__ = ["add_partial_flags", "partial_settings"]


def add_partial_flags(p: argparse.ArgumentParser) -> None:
    grp = p.add_argument_group("in-flight weight updates (partial rollouts; local engine)")
    grp.add_argument(
        "--partial-rollouts", action="store_true",
        help="generators take new weights between tokens; trades one version per GRPO group "
        "for fresher tokens",
    )  # fmt: skip
    grp.add_argument(
        "--weight-check-every", type=positive_int, default=1, metavar="N",
        help="with --partial-rollouts, look for new weights every N tokens (default 1)",
    )  # fmt: skip
    grp.add_argument(
        "--token-delay", type=nonneg_float, default=0.0, metavar="S",
        help="extra seconds per generated token (a slow decoder)",
    )  # fmt: skip


def partial_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``RunConfig`` fields the flags set (none when they were left at their defaults)."""
    out: dict[str, Any] = {}
    if args.partial_rollouts:
        out.update(partial_rollouts=True, weight_check_every=args.weight_check_every)
    elif args.weight_check_every != 1:
        raise ValueError("--weight-check-every applies to --partial-rollouts; add that flag")
    if args.token_delay:
        from nobubble.rl.system.config import RolloutConfig

        out["rollout"] = RolloutConfig(token_delay_s=args.token_delay)
    return out
