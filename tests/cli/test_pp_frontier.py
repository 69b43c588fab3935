"""``nobubble pp frontier``: points, Pareto flags checked by hand, the picture, exit-2 errors."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_frontier_json_points_and_pareto(capsys, tmp_path):
    png = tmp_path / "f.png"
    out = _json(capsys, ["pp", "frontier", "-p", "4", "-m", "8", "--model", "1.5B",
                         "--no-torch", "--mem-limits", "2,4", "--plot", str(png), "--json"])  # fmt: skip
    names = {q["schedule"] for q in out["points"]}
    assert {"1f1b", "zb-v", "v-min", "v-half", "v-zb", "zb-auto@2", "zb-auto@4"} <= names
    drawn = [q for q in out["points"] if q["peak_memory"] is not None]
    for q in drawn:  # Pareto by the definition, recomputed here
        dominated = any(o["peak_memory"] <= q["peak_memory"] + 1e-9
                        and o["bubble_rate"] <= q["bubble_rate"] + 1e-12
                        and (o["peak_memory"] < q["peak_memory"] - 1e-9
                             or o["bubble_rate"] < q["bubble_rate"] - 1e-12)
                        for o in drawn)  # fmt: skip
        assert q["pareto"] is not dominated, q
    one_f1b = next(q for q in drawn if q["schedule"] == "1f1b")
    assert one_f1b["peak_memory"] == pytest.approx(4.0)  # 1F1B holds p microbatches on rank 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out["files"] == [str(png)]


def test_frontier_table(capsys):
    assert main(["pp", "frontier", "-p", "2", "-m", "4", "--no-torch"]) == 0
    text = capsys.readouterr().out
    assert "Pareto-optimal" in text and "v-min" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["-p", "1"], "at least 2 ranks"),
     (["--mem-limits", "0.5"], "below one microbatch"),
     (["--mem-limits", "x"], "not a number"),
     (["--mem-limit", "3"], "--mem-limits (plural)"),
     (["-p", "64", "-m", "512"], "budget"),
     (["--costs", "no-such-profile.json"], "no such file"),
     (["--plot", "frontier.gif"], "a figure is written as .png, .svg, .pdf"),
     (["--plot", "."], "is a folder")],
)  # fmt: skip
def test_frontier_bad_input_one_line_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["pp", "frontier", "--no-torch", *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
