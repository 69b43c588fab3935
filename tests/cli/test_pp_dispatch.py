"""``nobubble pp simulate --dispatch static|handshake --jitter --straggler --seed``."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main
from nobubble.cli.pp.options import DISPATCH_CHOICES
from nobubble.pipeline.dispatch import DISPATCH_POLICIES

BASE = ["pp", "simulate", "-s", "zb-h1", "-p", "6", "-m", "8", "--tw", "0.5", "--tcomm", "0.05"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_choices_match_the_library() -> None:
    assert DISPATCH_CHOICES == DISPATCH_POLICIES


def test_handshake_beats_static_under_a_straggler(capsys) -> None:
    slow = ["--straggler", "3:1.5", "--json"]
    static = _json(capsys, [*BASE, "--dispatch", "static", *slow])
    handshake = _json(capsys, [*BASE, "--dispatch", "handshake", *slow])
    for out in (static, handshake):
        assert {"bubble_rate", "makespan", "peak_memory", "dispatch", "stragglers"} <= set(out)
        assert out["stragglers"] == ["3:1.5"] and len(out["peak_memory"]) == 6
    assert handshake["dispatch"] == "handshake" and handshake["schedule"] == "zb-h1+handshake"
    assert handshake["makespan"] < static["makespan"]
    assert handshake["bubble_rate"] < static["bubble_rate"]
    assert all(p <= lim for p, lim in zip(handshake["peak_memory"], handshake["mem_limit"]))


def test_jitter_is_seeded(capsys) -> None:
    runs = [_json(capsys, [*BASE, "--jitter", "0.2", "--seed", s, "--json"]) for s in "112"]
    assert runs[0]["makespan"] == runs[1]["makespan"] != runs[2]["makespan"]
    assert runs[0]["dispatch"] == "static" and runs[0]["jitter"] == 0.2


def test_no_flags_keep_todays_output(capsys) -> None:
    out = _json(capsys, [*BASE, "--json"])
    assert "dispatch" not in out and out["schedule"] == "zb-h1"


def test_handshake_mem_limit_on_any_schedule(capsys) -> None:
    """--mem-limit (M_F) is the handshake's limit even for a schedule that ignores it."""
    static = _json(capsys, [*BASE, "--json"])
    mem_f = static["peak_memory"][0] / 6  # ZB-H1 holds p = 6 microbatches on rank 0
    out = _json(capsys, [*BASE, "--dispatch", "handshake", "--mem-limit", "7", "--json"])
    assert out["mem_limit"] == pytest.approx([7 * mem_f] * 6)
    default = _json(capsys, [*BASE, "--dispatch", "handshake", "--json"])
    assert default["mem_limit"] == pytest.approx(static["peak_memory"])  # the plan's own


def test_table_names_the_policy_and_the_plot_draws_it(tmp_path, capsys) -> None:
    png = tmp_path / "g.png"
    argv = [*BASE, "--dispatch", "handshake", "--straggler", "1:1.5", "--plot", str(png)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "handshake, straggler 1:1.5" in text and "deviations" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--jitter", "-0.1"], "argument --jitter: -0.1 must be >= 0"),
        (["--jitter", "1"], "jitter=1.0 must be >= 0 and < 1"),
        (["--jitter", "nan"], "'nan' is not a finite number"),
        (["--straggler", "3"], "expected RANK:FACTOR[:STEPS]"),
        (["--straggler", "a:1.5"], "RANK 'a' is not an integer"),
        (["--straggler", "1:0"], "FACTOR 0 must be finite and > 0"),
        (["--straggler", "1:-2"], "FACTOR -2 must be finite and > 0"),
        (["--straggler", "1:inf"], "FACTOR inf must be finite"),
        (["--straggler", "1:1.5:0"], "STEPS '0'"),
        (["--straggler", "6:1.5"], "straggler rank 6 is outside ranks 0..5"),
        (["--dispatch", "eager"], "invalid choice: 'eager'"),
        (["--seed", "-1"], "must be >= 0"),
        (["--dispatch", "handshake", "--mem-limit", "2"], "below zb-h1's peak of 6 M_F on rank 0"),
        (
            ["--dispatch", "static", "--mem-limit", "8"],
            "mem_limit applies to zb-1p / zb-2p, not 'zb-h1'",
        ),
    ],
)
def test_bad_values_exit_2_with_one_line(flags, fragment, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main([*BASE, *flags]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
