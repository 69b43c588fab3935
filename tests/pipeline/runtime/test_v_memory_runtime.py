"""V-Min / V-Half / V-ZB on PipelineRunner: loss and every gradient equal one process
running the whole model (torch modules, fp32), on 2 and 4 gloo ranks.

The helpers are test_runner.py's: the reference is ``nn.Sequential(*stages)`` in this
process, the mean of the microbatch losses, one ``backward``.
"""

from __future__ import annotations

import pytest

from nobubble.distributed import spawn
from tests.pipeline.runtime.test_runner import NUM_MB, _check, _pipeline_rank
from tests.pipeline.runtime.torch_model import batch

NAMES = ("v-min", "v-half", "v-zb")


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_v_memory_schedules_match_one_process(num_ranks: int) -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    results = spawn(_pipeline_rank, num_ranks, args=(NAMES, xs, ys), timeout_s=240)
    _check(results, NAMES, num_ranks, xs, ys)
