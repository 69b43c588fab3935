"""``nobubble pp solve``: JSON and table output, files, infeasible limits, bad input."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import simulate
from tests.pipeline.ilp.ilp_bruteforce import Problem, search

# --mem-f 4 --mem-b 1 --mem-w 3: integer memory, the paper's proportions roughly (W frees most)
SMALL = ["pp", "solve", "-p", "2", "-m", "3", "--tf", "3", "--tb", "2", "--tw", "1",
         "--tcomm", "1", "--mem-f", "4", "--mem-b", "1", "--mem-w", "3", "--workers", "2"]  # fmt: skip


def test_json_reports_the_exhaustive_optimum_and_a_runnable_csv(capsys, tmp_path):
    csv_path, png_path = tmp_path / "s.csv", tmp_path / "s.png"
    code = main([*SMALL, "--mem-limit", "2", "--json", "--csv", str(csv_path),
                 "--plot", str(png_path)])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["status"] == "optimal" and data["gap"] == 0.0 and data["mem_limit"] == 8.0
    for key in ("objective", "bubble_rate", "lower_bound", "solve_seconds"):
        assert key in data
    best = search(Problem(2, 3, (3, 3), (2, 2), (1, 1), 1, (4, 4), (1, 1), (3, 3), 8.0))
    assert data["objective"] == best.value
    schedule = Schedule.from_csv(csv_path.read_text())
    costs = CostModel(t_f=(3, 3), t_b=(2, 2), t_w=(1, 1), t_comm=1, mem_f=(4, 4),
                      mem_b=(1, 1), mem_w=(3, 3))  # fmt: skip
    sim = simulate(schedule, costs)
    assert sim.max_span == data["objective"] and sim.bubble_rate == data["bubble_rate"]
    assert max(sim.peak_memory) <= 8.0
    assert png_path.read_bytes()[:4] == b"\x89PNG"


def test_table_shows_heuristic_and_ilp_rows(capsys):
    argv = ["pp", "solve", "-p", "3", "-m", "3", "--model", "1.5B", "--mem-limit", "3",
            "--workers", "2", "--time-limit", "20"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ilp (cp-sat)" in out and "heuristic zb-1p" in out and "optimal" in out


def test_infeasible_limit_exits_1_with_the_reason(capsys):
    assert main([*SMALL, "--mem-limit", "0.5", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "infeasible" and data["schedule_csv"] is None
    assert "below the activation memory of a single microbatch" in data["explanation"]


@pytest.mark.parametrize(
    "argv",
    [
        ["pp", "solve", "-p", "0"],
        ["pp", "solve", "--tf", "x"],
        ["pp", "solve", "--objective", "latency"],
        ["pp", "solve", "--time-limit", "-1"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_contradictory_memory_flags_exit_2_in_one_line(capsys):
    assert main(["pp", "solve", "--hidden", "8", "--mem-f", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not both" in err
