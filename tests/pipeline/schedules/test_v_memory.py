"""V-Min / V-Half / V-ZB: valid for every size, peak memory within the paper's bounds, V-ZB's
block is ZB-V's steady state, and their bubbles on the Zero Bubble paper's 12 configurations
beside ZB-V and ZB-1p and beside the paper's own V-Min / V-Half generator.

Memory is recounted here by walking each rank's actions (F stores mem_f, B frees mem_b,
W frees mem_w) in *rank units*: one microbatch's activations on one rank, the mem_f of its
two chunks together.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.pipeline.actions import Action, Op
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.schedules.v_memory import (
    V_MEMORY_NAMES,
    block_schedule,
    building_block,
    reordered_schedule,
)
from nobubble.pipeline.simulate import simulate
from nobubble.pipeline.validate import validate
from tests.pipeline.paper_table import ROWS, paper_costs

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


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_v_zb_block_is_zb_v_steady_state(p):
    """With T_F = T_B = T_W and T_comm = 0 (a chunk's op takes one slot), a microbatch in ZB-V's
    steady state runs exactly the V-ZB block, each W in the slot after its B."""
    m, i = 6 * p + 6, 3 * p + 3
    sched = get_schedule("zb-v", num_ranks=p, num_microbatches=m)
    result = simulate(sched, CostModel.uniform(p, t_f=2.0, t_b=2.0, t_w=2.0))  # 1 per chunk
    start = {a: result.start[r][k] for r, acts in enumerate(sched.rank_actions)
             for k, a in enumerate(acts) if a.microbatch == i}  # fmt: skip
    origin = start[Action(0, Op.F, i)]
    for r, (f0, f1, b1, b0) in enumerate(building_block("v-zb", p).slots):
        down, up = r, 2 * p - 1 - r
        want = {(down, Op.F): f0, (up, Op.F): f1, (up, Op.B): b1, (down, Op.B): b0,
                (up, Op.W): b1 + 1, (down, Op.W): b0 + 1}  # fmt: skip
        got = {key: start[Action(*key, i)] - origin for key in want}
        assert got == want, r


@pytest.mark.parametrize("name", V_MEMORY_NAMES)
def test_compaction_never_worse_than_its_sources(name):
    """Never worse than the block (nor, for V-ZB, than ZB-V), and never above its peak."""
    costs = paper_costs(ROWS[0])  # 1.5B, P=8, M=24
    sources = [block_schedule(building_block(name, 8), 24)]
    if name == "v-zb":
        sources.append(get_schedule("zb-v", num_ranks=8, num_microbatches=24))
    plain = [simulate(s, costs) for s in sources]
    ours = simulate(get_schedule(name, num_ranks=8, num_microbatches=24, costs=costs), costs)
    assert ours.max_span <= min(r.max_span for r in plain) + 1e-9
    assert max(ours.peak_memory) <= max(max(r.peak_memory) for r in plain) + 1e-9


@pytest.mark.parametrize("name", ["v-min", "v-half"])
@pytest.mark.parametrize("passes", [1, 2])
def test_reordering_keeps_the_block_peak(name, passes):
    """The paper's reordering fills the warm-up and cool-down without raising the peak."""
    block = building_block(name, 8)
    plain = block_schedule(block, 24)
    costs = paper_costs(ROWS[0]).for_stages(plain.stage_to_rank)
    cap = max(simulate(plain, costs).peak_memory)
    sched = reordered_schedule(block, 24, costs, cap, passes=passes)
    validate(sched)
    assert max(simulate(sched, costs).peak_memory) <= cap * (1 + 1e-9)
    assert simulate(sched, costs).max_span < simulate(plain, costs).max_span


def _ids(row):
    return f"{row['model']}-p{row['p']}-m{row['m']}"


# The paper's own V-Min / V-Half generator (sail-sg/zero-bubble-pipeline-parallelism,
# megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py: repeat, reorder twice,
# squeeze), run on each paper-table row with per-chunk costs T/2 and T_comm: bubble rate in
# % of its block as repeated, and after its reordering. Its reordering counts memory in whole
# chunk activations freed at W, so its V-Min ends at (p+4)/3 rank units (4.00 at p=8) where
# ours keeps the block's 3.37.
PAPER_GENERATOR = {  # (model, p, m): (v-min block, v-min, v-half block, v-half)
    ("1.5B", 8, 24): (33.61, 33.53, 20.11, 17.02),
    ("1.5B", 8, 32): (31.10, 31.03, 15.92, 13.39),
    ("1.5B", 8, 64): (27.61, 27.58, 8.79, 7.37),
    ("6.2B", 8, 24): (27.24, 27.21, 18.22, 14.47),
    ("6.2B", 8, 32): (25.00, 24.96, 14.46, 11.45),
    ("6.2B", 8, 64): (20.14, 20.13, 7.80, 6.07),
    ("14.6B", 16, 48): (29.33, 29.27, 19.02, 16.82),
    ("14.6B", 16, 64): (26.18, 26.15, 14.99, 13.18),
    ("14.6B", 16, 128): (20.86, 20.85, 8.11, 7.06),
    ("28.3B", 32, 96): (30.39, 30.27, 19.32, 17.80),
    ("28.3B", 32, 128): (27.22, 27.12, 15.23, 13.98),
    ("28.3B", 32, 256): (22.46, 22.42, 8.34, 7.65),
}


@pytest.mark.parametrize("row", ROWS, ids=_ids)
def test_blocks_match_the_paper_generator(row):
    """Our V-Min / V-Half blocks, repeated and simulated, give the paper generator's bubble."""
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)
    ref = PAPER_GENERATOR[(row["model"], p, m)]
    for name, want in (("v-min", ref[0]), ("v-half", ref[2])):
        got = simulate(block_schedule(building_block(name, p), m), costs).bubble_rate
        assert 100 * got == pytest.approx(want, abs=0.005), name


@pytest.mark.parametrize("row", [r for r in ROWS if r["p"] != "32"], ids=_ids)
def test_reordered_close_to_the_paper_generator(row):
    """After reordering and compaction: within 0.4 points of the paper generator's bubble
    (behind it by up to 0.35 at p=8, ahead of it at p=16; p=32 is slow here, see the
    benchmark)."""
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)
    ref = PAPER_GENERATOR[(row["model"], p, m)]
    for name, want in (("v-min", ref[1]), ("v-half", ref[3])):
        got = simulate(get_schedule(name, num_ranks=p, num_microbatches=m, costs=costs), costs)
        assert 100 * got.bubble_rate <= want + 0.4, name


@pytest.mark.parametrize("row", [r for r in ROWS if r["p"] == "8"], ids=_ids)
def test_paper_configurations(row, capsys):
    """Memory within the bounds on the paper's costs; the bubbles are printed beside ZB-V,
    ZB-1p and 1F1B (all 12 rows: benchmarks/pp_v_memory.py). V-ZB is never behind ZB-V at
    the same memory; V-Half beats 1F1B at about 60% of its memory; V-Min trades bubble for
    under half of it."""
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
    assert bubbles["v-zb"] <= bubbles["zb-v"] + 1e-12
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
