"""The channel's static (ordered) receive path on 2 real gloo ranks: messages are taken in
the sender's row order, a key asked for ahead of its turn leaves the earlier ones in the
mailbox, shapes learnt in one step travel without headers in the next, and a sender that
breaks its row's order is named."""

from __future__ import annotations

import pytest
import torch

from nobubble.distributed import spawn
from nobubble.pipeline import get_schedule
from nobubble.pipeline.runtime.channel import Channel, MessageKey, ShapeCache

SCHEDULE = get_schedule("1f1b", num_ranks=2, num_microbatches=3)
ACTS = [MessageKey("act", 1, m) for m in range(3)]  # what rank 0 sends rank 1, in row order


def _payload(m: int, step: int) -> torch.Tensor:
    return torch.full((2, m + 1), float(10 * step + m))


def _rank(ctx, send_order: list[int], steps: int) -> list[list[float]]:
    """Rank 0 sends its acts in ``send_order``; rank 1 takes them last first."""
    shapes = ShapeCache()
    got: list[list[float]] = []
    for step in range(steps):
        ch = Channel(SCHEDULE, ctx.rank, device=torch.device("cpu"), timeout_s=30, shapes=shapes)
        if ctx.rank == 0:
            for m in send_order:
                ch.send(ACTS[m], 1, _payload(m, step))
            for m in range(3):  # rank 1's grads, which the 1F1B row sends back
                ch.receive(MessageKey("grad", 0, m), 1)
        else:
            assert all(ch.has(k, 0) for k in ACTS)  # ordered: owed counts as on its way
            for m in reversed(range(3)):  # the last first: the others wait in the mailbox
                t = ch.receive(ACTS[m], 0)
                assert t.shape == (2, m + 1)
                got.append([float(t[0, 0]), m, step])
            for m in range(3):
                ch.send(MessageKey("grad", 0, m), 0, torch.zeros(1))
        ch.finish()
    return got


def test_ordered_receive_takes_the_row_order_and_keeps_the_mailbox() -> None:
    got = spawn(_rank, 2, args=([0, 1, 2], 2), timeout_s=120)[1]
    # second step: shapes cached, no headers, the same tensors
    assert got == [[10.0 * s + m, m, s] for s in range(2) for m in (2, 1, 0)]


def test_a_sender_out_of_its_row_order_is_named() -> None:
    with pytest.raises(Exception, match=r"rank 0 sent MessageKey\(kind='act', stage=1, "
                       r"microbatch=1\) where its schedule row sends .*microbatch=0"):  # fmt: skip
        spawn(_rank, 2, args=([1, 0, 2], 1), timeout_s=120)
