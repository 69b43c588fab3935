"""Property tests of the runtime's pure pieces: block partition, W's product, bubble math."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.runtime.bw_split import weight_grad
from nobubble.pipeline.runtime.executor import RankResult
from nobubble.pipeline.runtime.models import GPTConfig, MLPConfig, partition_blocks
from nobubble.pipeline.runtime.report import measured_bubble
from nobubble.trace import Event


@given(layers=st.integers(1, 40), stages=st.integers(1, 40), gpt=st.booleans())
def test_partition_is_a_balanced_contiguous_cover(layers, stages, gpt):
    config = GPTConfig(num_layers=layers) if gpt else MLPConfig(num_layers=layers)
    if stages > layers:
        with pytest.raises(ValueError, match=f"{layers} layers but the schedule has {stages}"):
            partition_blocks(config, stages)
        return
    ranges = partition_blocks(config, stages)
    assert ranges[0].start == 0 and ranges[-1].stop == config.num_blocks
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:], strict=False))
    weighted = [sum(config.block_weight(i) for i in r) for r in ranges]
    assert min(weighted) >= 1 and max(weighted) - min(weighted) <= 1


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    n_in=st.integers(1, 6),
    n_out=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_weight_grad_equals_autograd(lead, n_in, n_out, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, n_in, generator=gen, dtype=torch.float64)
    dy = torch.randn(*lead, n_out, generator=gen, dtype=torch.float64)
    w = torch.randn(n_out, n_in, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_out, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.linear(x, w, b).backward(dy)
    dw, db = weight_grad(x, dy)
    torch.testing.assert_close(dw, w.grad)
    torch.testing.assert_close(db, b.grad)


def _result(rank, spans):
    events = tuple(
        Event(name="op", cat="F", rank=rank, start_us=s, dur_us=d, args={"step": 0})
        for s, d in spans
    )
    return RankResult(rank=rank, schedule="x", stages=(rank,), step_times_s=(0.0,),
                      losses=None, events=events, peak_activation_bytes=0)  # fmt: skip


def test_measured_bubble_is_the_papers_definition():
    # rank 0 busy 0-10 and 30-40 (span 40, busy 20); rank 1 busy 10-30 plus a wait event
    r0 = _result(0, [(0.0, 10.0), (30.0, 10.0)])
    r1 = _result(1, [(10.0, 20.0)])
    wait = Event(name="wait", cat="wait", rank=1, start_us=0.0, dur_us=10.0, args={"step": 0})
    r1 = RankResult(**{**r1.__dict__, "events": (wait, *r1.events)})
    makespan_s, bubble = measured_bubble([r0, r1], 0)
    assert makespan_s == 40e-6
    assert bubble == (40.0 - 20.0) / 40.0  # (max span - max busy) / max span; waits excluded
