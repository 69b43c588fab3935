"""``nobubble pp``: tables, JSON, files, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import inspect
import json

import pytest

from nobubble.cli import main
from nobubble.cli.pp.options import COST_FLAGS, TIME_FLAGS
from nobubble.pipeline.costs import CostModel
from nobubble.trace import read_chrome_trace


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_cost_flags_are_the_cost_models_settings():
    # the attributes read off the flag rows: every keyword of from_settings, in its order
    params = inspect.signature(CostModel.from_settings).parameters.values()
    assert [dest for _, dest in COST_FLAGS] == [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    assert [flag for flag, _ in TIME_FLAGS] == ["--model", "--tf", "--tb", "--tw", "--tcomm"]


def test_simulate_json_closed_form(capsys):
    p, m = 4, 8
    out = _json(capsys, ["pp", "simulate", "-s", "1f1b", "-p", str(p), "-m", str(m), "--json"])
    # unit costs, no comm: 1F1B idles (p-1)(F+B+W) of a span m(F+B+W) + (p-1)(F+B+W)
    assert out["bubble_rate"] == pytest.approx((p - 1) / (m + p - 1))
    assert out["schedule"] == "1f1b" and out["stages"] == p and out["microbatches"] == m
    assert len(out["peak_memory"]) == p
    assert out["max_peak_memory_vs_1f1b"] == pytest.approx(1.0)


def test_simulate_writes_plot_and_trace(tmp_path, capsys):
    png, trace = tmp_path / "g.png", tmp_path / "t.json"
    argv = ["pp", "simulate", "-s", "zb-h1", "-p", "3", "-m", "6", "--model", "1.5B",
            "--plot", str(png), "--trace", str(trace)]  # fmt: skip
    assert main(argv) == 0
    assert "bubble rate" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events, names = read_chrome_trace(trace)
    assert len(events) == 3 * 6 * 3 and len(names) == 3


def test_compare_json_has_every_schedule(capsys):
    out = _json(capsys, ["pp", "compare", "-p", "4", "-m", "8", "--model", "1.5B", "--json"])
    rows = {r["schedule"]: r for r in out["rows"]}
    assert {"1f1b", "zb-h1", "zb-2p", "zb-v", "torch-zbv"} <= set(rows)
    assert rows["1f1b"]["throughput_vs_1f1b"] == pytest.approx(1.0)
    assert rows["zb-2p"]["throughput_vs_1f1b"] > rows["zb-h1"]["throughput_vs_1f1b"] > 1.0


def test_export_then_validate(tmp_path, capsys):
    path = tmp_path / "s.csv"
    assert main(["pp", "export", "-s", "zb-2p", "-p", "4", "-m", "8", "-o", str(path)]) == 0
    capsys.readouterr()
    out = _json(capsys, ["pp", "validate", str(path), "--json"])
    assert out["valid"] and out["stages"] == 4 and out["actions"] == 4 * 8 * 3


def test_show_grid(capsys):
    assert main(["pp", "show", "-s", "1f1b", "-p", "4", "-m", "8"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Rank")]
    assert [r.split(": ")[1][:7] for r in rows] == ["F F F F", "_ F F F", "_ _ F F", "_ _ _ F"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["pp", "simulate", "-s", "pipedream"], "unknown schedule"),
        (["pp", "simulate", "-p", "0"], "must be > 0"),
        (["pp", "simulate", "-m", "-3"], "must be > 0"),
        (["pp", "simulate", "--tf", "0"], "must be > 0"),
        (["pp", "simulate", "--tcomm", "-1"], "must be >= 0"),
        (
            ["pp", "simulate", "--hidden", "8", "--heads", "2", "--seq", "4", "--mem-f", "1"],
            "not both",
        ),
        (["pp", "simulate", "--mem-f", "1", "--mem-b", "2", "--mem-w", "2"], "frees more"),
        (["pp", "simulate", "-s", "interleaved-1f1b", "-p", "4", "-m", "6"], "divisible"),
        (["pp", "simulate", "-s", "zb-1p", "--mem-limit", "0.5"], "below one microbatch"),
        (["pp", "simulate", "--plot", "x.gif"], "a figure is written as .png, .svg, .pdf"),
        (["pp", "validate", "does-not-exist.csv"], "does-not-exist.csv: no such file"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_invalid_csv_names_action(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("0F0,0I0\n1F0,1I0,1W0\n")
    assert main(["pp", "validate", str(path)]) == 2
    assert "0I0 has no W" in capsys.readouterr().err


def test_per_rank_costs(capsys):
    """First and last ranks carry embedding and head: --tf as a per-rank list."""
    argv = ["pp", "simulate", "-s", "zb-h1", "-p", "4", "-m", "8", "--tf", "3,1,1,2", "--json"]
    out = _json(capsys, argv)
    assert out["busy"] == pytest.approx([8 * (3 + 2), 8 * 3, 8 * 3, 8 * (2 + 2)])
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["pp", "simulate", "-p", "4", "--tf", "1,2"]))
    assert exc.value.code == 2 and "one per rank (4)" in capsys.readouterr().err
