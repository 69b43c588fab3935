"""Per-token policy versions: what partial rollouts record, and the rule each mode asserts
(the why: ``docs/rl/system.md``, partial rollouts). A token's staleness is ``trainer version
- its version``.

Legend: ``B`` responses, ``N`` response tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from nobubble.rl.algo.staleness import policy_lag
from nobubble.rl.system.types import Sample, SampleGroup

__all__ = ["response_versions", "check_token_versions", "token_lag", "lag_histogram"]


def response_versions(samples: Sequence[Sample]) -> torch.Tensor:
    """(B, N) int64: the version behind each response token of each sample."""
    if all(s.token_versions is None for s in samples):  # whole-group: one version per row
        rows = torch.tensor([s.policy_version for s in samples], dtype=torch.int64)  # (B,)
        return rows[:, None].expand(-1, samples[0].response_mask.shape[0])  # (B, N)
    return torch.stack([s.versions() for s in samples])


def check_token_versions(groups: Sequence[SampleGroup], *, partial: bool) -> None:
    """Raise ValueError unless every group keeps its mode's versioning rule.

    ``partial=False`` (whole-group versioning): every token of every response is the group's
    version. ``partial=True``: each response starts at the group's version and its versions
    never decrease.
    """
    for g in groups:
        if all(s.token_versions is None for s in g.samples):
            continue  # one policy_version per group, checked by SampleGroup itself
        for s in g.samples:
            if s.versions().shape != s.response_mask.shape:
                raise ValueError(
                    f"sample {s.sample_id}: token_versions of shape "
                    f"{tuple(s.versions().shape)} for {tuple(s.response_mask.shape)} tokens"
                )
        v = response_versions(g.samples)  # (G, N)
        if not partial:
            if bool((v != g.policy_version).any()):
                raise ValueError(
                    f"group {g.group_id} has tokens of versions {sorted(set(v.flatten().tolist()))}"
                    f", not only {g.policy_version}; whole-group versioning is the default "
                    "mode's rule (a generator swaps weights between groups); set "
                    "RunConfig.partial_rollouts=True to trade it for fresher tokens"
                )
            continue
        if bool((v[:, 0] != g.policy_version).any()):
            raise ValueError(
                f"group {g.group_id}: a response starts at versions {v[:, 0].unique().tolist()}, "
                f"the group at {g.policy_version}"
            )
        if v.shape[1] > 1 and bool((v[:, 1:] < v[:, :-1]).any()):
            bad = int((v[:, 1:] < v[:, :-1]).any(1).nonzero()[0])
            raise ValueError(
                f"sample {g.samples[bad].sample_id}: token versions {v[bad].tolist()} go "
                "back; weights only move forward"
            )


def token_lag(versions: torch.Tensor, trainer_version: int) -> torch.Tensor:
    """(B, N) int64 ``trainer_version - versions``; ValueError if a token is newer than the
    trainer (see :func:`~nobubble.rl.algo.staleness.policy_lag`)."""
    return policy_lag(versions.reshape(-1), trainer_version).view(versions.shape)


def lag_histogram(lag: torch.Tensor, mask: torch.Tensor) -> dict[int, int]:
    """Response tokens by staleness: ``{lag: count}`` over the tokens where ``mask`` (B, N)
    is set."""
    counts = Counter(lag[mask.bool()].tolist())
    return {int(k): int(n) for k, n in sorted(counts.items())}
