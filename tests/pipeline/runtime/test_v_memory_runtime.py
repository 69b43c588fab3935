"""V-Min / V-Half / V-ZB on PipelineRunner: loss and every gradient equal one process
running the whole model (torch modules, fp32), on 2 and 4 gloo ranks.

The helpers are runner_check.py's, as test_runner.py's: the reference is
:func:`nobubble.pipeline.reference.reference_step`, ``nn.Sequential(*stages)`` in this
process, the mean of the microbatch losses, one ``backward``.
"""

from __future__ import annotations

import pytest

from nobubble.distributed import spawn
from tests.pipeline.runtime.runner_check import NUM_MB, check_against_reference, pipeline_rank
from tests.pipeline.runtime.torch_model import batch

NAMES = ("v-min", "v-half", "v-zb")


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_v_memory_schedules_match_one_process(num_ranks: int) -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(NUM_MB)), list(y.chunk(NUM_MB))
    results = spawn(pipeline_rank, num_ranks, args=(NAMES, xs, ys), timeout_s=240)
    check_against_reference(results, NAMES, num_ranks, xs, ys)
