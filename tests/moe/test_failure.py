"""A rank that dies or hangs makes the others fail within the timeout with a clear message.

The four-rank cases (every survivor, both transports, masking) are in test_masking.py.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from nobubble.distributed import RankFailure, spawn
from nobubble.moe import Buffer

TIMEOUT_S = 6.0


def _dispatch_with_a_casualty(ctx, how: str):
    buf = Buffer(num_experts=4, transport="dist", timeout_s=TIMEOUT_S)  # gloo collectives
    x = torch.ones(4, 8) * ctx.rank
    idx = torch.tensor([[0, 3]] * 4)
    buf.combine(buf.dispatch(x, idx).recv_x, buf.dispatch(x, idx).handle)  # healthy round first
    if ctx.rank == 1:
        if how == "dies":
            os._exit(0)  # vanish without a word: the parent sees no error from this rank
        time.sleep(4 * TIMEOUT_S)  # hang
    buf.dispatch(x, idx)
    return "unreachable"


@pytest.mark.parametrize(
    "how",
    ["dies", pytest.param("hangs", marks=pytest.mark.long)],  # hangs: waits out a timeout
)
def test_peer_failure_raises_transport_error(how):
    with pytest.raises(RankFailure) as info:  # the transport's error, not spawn's timeout
        spawn(_dispatch_with_a_casualty, 2, args=(how,), timeout_s=300)
    err = info.value
    assert err.rank == 0, str(err)
    assert "PeerFailure" in str(err) and "peer rank died or stopped responding" in str(err)
    assert "layout phase, all_to_all(layout)" in str(err)
    assert "rank(s) [1] did not arrive" in str(err)  # the survivor names the missing rank
