"""V-Min / V-Half / V-ZB: valid for every size, peak memory within the paper's bounds, and
their bubbles on the Zero Bubble paper's 12 configurations beside ZB-V and ZB-1p.

Memory is recounted here by walking each rank's actions (F stores mem_f, B frees mem_b,
W frees mem_w) in *rank units*: one microbatch's activations on one rank, the mem_f of its
two chunks together.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.schedules.v_memory import (
    V_MEMORY_NAMES,
    block_schedule,
    building_block,
)
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import validate
from tests.pipeline.test_paper_table import ROWS, paper_costs

BOUND = {"v-min": lambda p: (p + 4) / 3, "v-half": lambda p: (p + 2) / 2, "v-zb": float}


def recount_peak(schedule, costs: CostModel) -> float:
    """Largest per-rank activation peak in rank units, by a plain walk over the actions."""
    costs = costs.for_stages(schedule.stage_to_rank)
    worst = 0.0
    for rank, acts in enumerate(schedule.rank_actions):
        unit = sum(costs.mem_f[s] for s, r in enumerate(schedule.stage_to_rank) if r == rank)
        level = peak = 0.0
        for a in acts:
            if a.op is Op.F:
                level += costs.mem_f[a.stage]
            elif a.op is Op.B:
                level -= costs.mem_b[a.stage]
            else:
                level -= costs.mem_w[a.stage]
            peak = max(peak, level)
        worst = max(worst, peak / unit)
    return worst


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(V_MEMORY_NAMES), st.integers(1, 12), st.integers(1, 40),
       st.floats(0.5, 2.0), st.floats(0.5, 2.0), st.floats(0.2, 1.5), st.floats(0.0, 0.3))  # fmt: skip
def test_valid_and_within_memory_bound(name, p, m, tf, tb, tw, tcomm):
    # all memory freed at W (mem_b = 0): the worst case for the bound
    costs = CostModel.uniform(p, t_f=tf, t_b=tb, t_w=tw, t_comm=tcomm, mem_f=2.0, mem_b=0.0)
    sched = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs)
    validate(sched)
    assert sched.num_ranks == p and sched.num_stages == 2 * p and sched.num_microbatches == m
    assert sched.stage_to_rank == tuple(range(p)) + tuple(reversed(range(p)))
    assert recount_peak(sched, costs) <= max(1.0, BOUND[name](p)) + 1e-9


@pytest.mark.parametrize("name", V_MEMORY_NAMES)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8, 9, 12, 16])
def test_block_slots_distinct_and_dependencies_earlier(name, p):
    """The block's four slots differ modulo 6 on every rank, and every input of an op sits
    in an earlier slot (which makes the repeated block valid for any m)."""
    slots = building_block(name, p).slots
    for r in range(p):
        assert len({s % 6 for s in slots[r]}) == 4, (r, slots[r])
    f0, f1, b1, b0 = zip(*slots)
    for r in range(1, p):
        assert f0[r] > f0[r - 1] and b1[r] > b1[r - 1]
    for r in range(p - 1):
        assert f1[r] > f1[r + 1] and b0[r] > b0[r + 1]
    assert f1[p - 1] > f0[p - 1] and b1[0] > f1[0] and b0[p - 1] > b1[p - 1]


@pytest.mark.parametrize("name", V_MEMORY_NAMES)
def test_compaction_never_worse_than_the_block(name):
    row = ROWS[0]  # 1.5B, P=8, M=24
    costs = paper_costs(row)
    plain = simulate(block_schedule(building_block(name, 8), 24), costs)
    ours = simulate(get_schedule(name, num_ranks=8, num_microbatches=24, costs=costs), costs)
    assert ours.max_span <= plain.max_span + 1e-9
    assert max(ours.peak_memory) <= max(plain.peak_memory) + 1e-9


def _ids(row):
    return f"{row['model']}-p{row['p']}-m{row['m']}"


@pytest.mark.parametrize("row", [r for r in ROWS if r["p"] == "8"], ids=_ids)
def test_paper_configurations(row, capsys):
    """Memory within the bounds on the paper's costs; the bubbles are printed beside ZB-V,
    ZB-1p and 1F1B (all 12 rows: benchmarks/pp_v_memory.py). Shape checks only: V-Half
    beats 1F1B at about 60% of its memory; V-Min trades bubble for under half of it."""
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)
    bubbles = {}
    for name in (*V_MEMORY_NAMES, "zb-v", "zb-1p", "1f1b"):
        sched = get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs)
        bubbles[name] = simulate(sched, costs).bubble_rate
        if name in BOUND:
            assert recount_peak(sched, costs) <= BOUND[name](p) + 1e-9
    with capsys.disabled():
        print(f"\n{_ids(row)}: " + ", ".join(f"{k} {v:.2%}" for k, v in bubbles.items()))
    assert bubbles["v-half"] < bubbles["1f1b"] < bubbles["v-min"]
    assert all(0 <= b < 1 and math.isfinite(b) for b in bubbles.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"num_ranks": 0, "num_microbatches": 4}, "num_ranks"),
     ({"num_ranks": 2, "num_microbatches": 0}, "num_microbatches"),
     ({"num_ranks": 2, "num_microbatches": 4, "num_chunks": 3}, "2 chunks"),
     ({"num_ranks": 2, "num_microbatches": 4, "mem_limit": 3.0}, "mem_limit")],
)  # fmt: skip
def test_bad_input_names_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_schedule("v-min", **kwargs)


def test_unknown_block_and_wrong_costs():
    with pytest.raises(ValueError, match="v-min, v-half, v-zb"):
        building_block("v-quarter", 4)
    with pytest.raises(ValueError, match="one per rank"):
        get_schedule("v-half", num_ranks=4, num_microbatches=8, costs=CostModel.uniform(3))
