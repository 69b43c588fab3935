"""The built-in models through the one planner: the cut pinned to the one ``pp run`` builds,
a stage profile's costs weighed as the profile's own cost model gives them, the memory limit,
recompute and the exact solver's schedule."""

from __future__ import annotations

import pytest

from nobubble.distributed.options import LaunchOptions
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.models import GPTConfig, MLPConfig, partition_blocks
from nobubble.pipeline.runtime.planning import (
    RuntimeCosts,
    builtin_cuts,
    make_plan,
    plan_builtin,
    plan_from_profile,
)
from nobubble.pipeline.runtime.profile import Profile, StageProfile
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

TINY_GPT = GPTConfig(vocab_size=32, seq_len=8, hidden=16, num_heads=2, num_layers=4)


def stage(k: int, t_f: float, t_b: float, t_w: float, fused: float, mem: int, out: int):
    return StageProfile(stage=k, blocks=(k,), t_f=t_f, t_b=t_b, t_w=t_w, t_bw_fused=fused,
                        mem_f=mem, mem_w=mem, bw_ratio=(t_b + t_w) / fused, out_bytes=out)  # fmt: skip


PROFILE = Profile(
    model="gpt", microbatch_size=4, t_comm=0.5, activation_bytes=400,
    stages=(stage(0, 2.0, 1.0, 1.5, 2.2, 1000, 400), stage(1, 3.0, 2.0, 1.0, 2.8, 1200, 900)),
)  # fmt: skip


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved-1f1b"])
def test_a_stage_profile_is_weighed_as_its_own_cost_model(name: str) -> None:
    """Fused-backward schedules see exactly the profile's per-stage costs (split evenly over
    two chunks for interleaved, as :meth:`CostModel.for_stages` splits them)."""
    p = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4)
    sched = get_schedule(name, num_ranks=2, num_microbatches=4)
    costs = PROFILE.cost_model().for_stages(sched.stage_to_rank)
    if name == "interleaved-1f1b":  # chunk 1 of rank 0 is the profile's stage 0's second half
        costs = PROFILE.cost_model().for_stages((0, 0, 1, 1))
    ref = simulate(sched, costs)
    got = next(c for c in p.candidates if c.schedule == name)
    assert got.predicted_step_ms == pytest.approx(ref.makespan, rel=1e-9)
    if name != "interleaved-1f1b":
        assert got.predicted_peak_bytes == pytest.approx(ref.peak_memory, rel=1e-9)
        assert got.cuts == (2,)  # one stage per rank: the profiled stages, whole


def test_the_fastest_that_fits_is_chosen_and_none_fitting_is_refused() -> None:
    free = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, recompute=True)
    assert free.chosen == free.candidates[0]  # no tolerance: the fastest
    assert {c.recompute[0] for c in free.candidates} == {False, True}
    plain = min(max(c.predicted_peak_bytes) for c in free.candidates if not c.recompute[0])
    limit = 0.9 * plain
    tight = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, recompute=True,
                              memory_limit=limit)  # fmt: skip
    fitting = [c for c in tight.candidates if max(c.predicted_peak_bytes) <= limit]
    assert tight.chosen == fitting[0] and tight.recompute[0]
    with pytest.raises(ValueError, match="no candidate fits memory_limit"):
        plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, memory_limit=limit)
    with pytest.raises(ValueError, match="the profile has 2 stages but num_ranks is 3"):
        plan_from_profile(PROFILE, num_ranks=3, num_microbatches=6)


def test_the_exact_solvers_schedule_is_weighed_and_rebuilt_from_the_plan() -> None:
    p = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, ilp_time_limit_s=10)
    exact = [c for c in p.candidates if c.schedule.startswith("ilp-")]
    assert len(exact) == 1 and exact[0].actions is not None
    best_named = min(c.predicted_step_ms for c in p.candidates if c.actions is None
                     and c.cuts == (2,) and not c.recompute[0])  # fmt: skip
    assert exact[0].predicted_step_ms <= best_named * (1 + 1e-9)  # least makespan on its cut
    again = Plan.from_json(p.to_json())
    assert again == p
    assert again.simulate(exact[0]).makespan == pytest.approx(exact[0].predicted_step_ms)


def test_the_exact_solver_searches_within_the_memory_limit() -> None:
    free = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, ilp_time_limit_s=10)
    (fastest,) = [c for c in free.candidates if c.schedule.startswith("ilp-")]
    limit = 0.8 * max(fastest.predicted_peak_bytes)  # the unconstrained optimum does not fit
    tight = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4, ilp_time_limit_s=10,
                              memory_limit=limit)  # fmt: skip
    exact = [c for c in tight.candidates if c.schedule.startswith("ilp-")]
    assert exact, "the solver found no schedule within the limit"
    assert exact[0].fits and max(exact[0].predicted_peak_bytes) <= limit


def test_builtin_cuts_are_the_ones_pp_run_builds() -> None:
    for model, ranks in ((TINY_GPT, 2), (MLPConfig(num_layers=3), 2), (TINY_GPT, 4)):
        ref = [tuple(r.start for r in partition_blocks(model, s)[1:])
               for s in (ranks, 2 * ranks) if s <= model.num_layers]  # fmt: skip
        assert list(builtin_cuts(model, ranks)) == ref
    with pytest.raises(ValueError, match="4 layers but the schedule has 5 stages"):
        builtin_cuts(TINY_GPT, 5)


def test_a_builtin_model_is_planned_on_the_pinned_cut_from_its_blocks() -> None:
    p = plan_builtin(TINY_GPT, num_ranks=2, num_microbatches=4, microbatch_size=2,
                     recompute=True, runtime=RuntimeCosts(0.0, 0.0))  # fmt: skip
    assert p.num_blocks == TINY_GPT.num_blocks and p.setting.microbatch_size == 2
    assert {c.cuts for c in p.candidates} == set(builtin_cuts(TINY_GPT, 2))
    assert {c.schedule for c in p.candidates} >= {"1f1b", "zb-h1", "zb-2p", "zb-v"}
    assert p.chosen == p.candidates[0]
    assert p.schedule().num_stages == len(p.cuts) + 1


def test_make_plan_takes_the_planner_of_its_source_and_refuses_none_or_two() -> None:
    """``pp plan``'s one call: a stage profile goes to plan_from_profile (the same plan); no
    source, or two (one would be ignored), is a ValueError naming what to give."""
    direct = plan_from_profile(PROFILE, num_ranks=2, num_microbatches=4)
    made = make_plan(num_ranks=2, num_microbatches=4, launch=LaunchOptions(), profile=PROFILE)
    assert made == direct
    with pytest.raises(ValueError, match="sources none; give exactly one of profile"):
        make_plan(num_ranks=2, num_microbatches=4, launch=LaunchOptions())
    with pytest.raises(ValueError, match=r"sources \['profile', 'model'\]; give exactly one"):
        make_plan(num_ranks=2, num_microbatches=4, launch=LaunchOptions(), profile=PROFILE,
                  model=TINY_GPT)  # fmt: skip
