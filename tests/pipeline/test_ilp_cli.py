"""``nobubble pp solve``: JSON and table output, files, infeasible limits, bad input."""

from __future__ import annotations

import json

import pytest

from nobubble.cliutil import ArgumentParser
from nobubble.pipeline import ilp_cli
from nobubble.pipeline.actions import Schedule
from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.simulate import simulate

from .ilp_bruteforce import Problem, search


def _run(argv: list[str]) -> int:
    parser = ArgumentParser(prog="nobubble pp")
    ilp_cli.register(parser.add_subparsers(dest="pp_command", parser_class=ArgumentParser))
    args = parser.parse_args(argv)
    return args.func(args)


def test_json_reports_the_exhaustive_optimum_and_a_runnable_csv(capsys, tmp_path):
    argv = ["solve", "-p", "2", "-m", "3", "--tf", "3", "--tb", "2,4", "--tw", "1", "--comm", "1"]
    csv_path, png_path = tmp_path / "s.csv", tmp_path / "s.png"
    code = _run([*argv, "--mem-limit", "2", "--workers", "2", "--json", "--csv", str(csv_path),
                 "--plot", str(png_path)])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["status"] == "optimal" and data["gap"] == 0.0 and data["mem_limit"] == 2.0
    for key in ("objective", "bubble_rate", "lower_bound", "solve_seconds"):
        assert key in data
    # CLI memory: M_F = 1 per rank, B and W free half each; limit 2 = two microbatches
    best = search(Problem(2, 3, (3, 3), (2, 4), (1, 1), 1, (1, 1), (0.5, 0.5), (0.5, 0.5), 2.0))
    assert data["objective"] == best.value
    schedule = Schedule.from_csv(csv_path.read_text())
    costs = CostModel(t_f=(3, 3), t_b=(2, 4), t_w=(1, 1), t_comm=1, mem_f=(1, 1),
                      mem_b=(0.5, 0.5), mem_w=(0.5, 0.5))  # fmt: skip
    sim = simulate(schedule, costs)
    assert sim.max_span == data["objective"] and sim.bubble_rate == data["bubble_rate"]
    assert png_path.read_bytes()[:4] == b"\x89PNG"


def test_table_shows_heuristic_and_ilp_rows(capsys):
    assert _run(["solve", "-p", "3", "-m", "3", "--mem-limit", "1p", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "ilp (cp-sat)" in out and "heuristic" in out and "optimal" in out


def test_infeasible_limit_exits_1_with_the_reason(capsys):
    assert _run(["solve", "-p", "3", "-m", "3", "--mem-limit", "0.5", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "infeasible"
    assert "below the activation memory of a single microbatch" in data["explanation"]


def test_paper_model_memory_and_p_multiples():
    costs = CostModel.paper(4, t_f=1, t_b=1, t_w=1, t_comm=0, hidden=2304, heads=24, seq=1024)
    assert ilp_cli.parse_mem_limit("2p", costs) == 8 * costs.mem_f[0]
    assert ilp_cli.parse_mem_limit("7.5", costs) == 7.5
    assert ilp_cli.parse_mem_limit(None, costs) is None
    with pytest.raises(ValueError, match="'0.5x'"):
        ilp_cli.parse_mem_limit("0.5x", costs)


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", "-p", "0", "-m", "2"],
        ["solve", "-p", "2", "-m", "2", "--tf", "1,x"],
        ["solve", "-p", "2", "-m", "2", "--objective", "latency"],
        ["solve", "-p", "2", "-m", "2", "--time-limit", "-1"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        _run(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err
