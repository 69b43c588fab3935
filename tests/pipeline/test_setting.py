"""PipelineSetting, the library side of ``nobubble pp``'s size/cost/limit flags: Python gets
the command line's refusals, word for word, and the same schedules."""

from __future__ import annotations

import pytest

from nobubble.cli import main
from nobubble.pipeline import get_schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.dispatch.perturb import Perturbation
from nobubble.pipeline.setting import PipelineSetting

HUGE = PipelineSetting(num_ranks=1_000_000_000, num_microbatches=1)
BIG_V = PipelineSetting(num_ranks=64, num_microbatches=512, schedule="v-min")
LOW = PipelineSetting(num_ranks=4, num_microbatches=8, schedule="zb-1p", mem_limit=0.5)
PAST_PEAK = PipelineSetting(schedule="1f1b", mem_limit=1.5)


def _cli_error(argv: list[str], capsys) -> str:
    """The command line's one-line refusal of ``argv``, without its ``nobubble pp: error:``."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err.strip().removeprefix("nobubble pp: error: ")


@pytest.mark.parametrize(
    ("setting", "call", "argv", "needle"),
    [
        (
            HUGE,
            lambda s: s.build(unit=True),
            "pp show -p 1000000000 -m 1",
            "--ranks/--microbatches: ",
        ),
        (BIG_V, lambda s: s.build(), "pp simulate -s v-min -p 64 -m 512", "for the V generators"),
        (
            LOW,
            lambda s: s.build(),
            "pp simulate -s zb-1p -p 4 -m 8 --mem-limit 0.5",
            "--mem-limit 0.5 is below one microbatch's activations (the unit is M_F)",
        ),
        (
            PAST_PEAK,
            lambda s: s.dispatch(
                s.build(limit_elsewhere=True), s.cost_model(), "handshake", Perturbation()
            ),
            "pp simulate -s 1f1b --dispatch handshake --mem-limit 1.5",
            "--mem-limit 1.5 is below 1f1b's peak of 4 M_F on rank 0; give at least 4",
        ),
    ],
    ids=["size", "v-budget", "limit-below-one", "handshake-below-peak"],
)
def test_the_library_refuses_as_the_command_line_does(setting, call, argv, needle, capsys) -> None:
    with pytest.raises(ValueError) as err:
        call(setting)
    assert needle in str(err.value)
    assert str(err.value) == _cli_error(argv.split(), capsys)


def test_force_and_a_size_from_a_file_skip_the_budget() -> None:
    PipelineSetting(num_ranks=1_000_000_000, num_microbatches=1, force=True).check_size()
    PipelineSetting(num_ranks=None, num_microbatches=None).check_size()


def test_the_schedule_is_the_registry_s_for_the_costs() -> None:
    setting = PipelineSetting(num_ranks=4, num_microbatches=8, schedule="zb-2p",
                              costs={"model": "1.5B"}, mem_limit=6)  # fmt: skip
    costs = CostModel.from_settings(4, model="1.5B")
    want = get_schedule("zb-2p", num_ranks=4, num_microbatches=8, costs=costs,
                        mem_limit=6 * max(costs.mem_f))  # fmt: skip
    assert setting.cost_model() == costs
    assert setting.build().rank_actions == want.rank_actions
    assert setting.limit_for(costs) == 6 * max(costs.mem_f)
    assert PipelineSetting(mem_limit=0.5).limit_for(costs, below_one=True) == 0.5 * max(costs.mem_f)
