"""``nobubble ep train`` end to end: a real MoE-GPT trained with expert parallelism learns,
equals the dense single-process model step for step, and online EPLB lowers the rank load
imbalance; usage errors and timeouts reach the user in one line."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main


def train(argv, tmp_path, capsys):
    """Run ``nobubble ep train ... --json``; returns (exit status, report)."""
    plot = tmp_path / "ep_train.png"
    rc = main(["ep", "train", *argv, "--plot", str(plot), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["plot"] == str(plot) and plot.stat().st_size > 1000
    return rc, report


def test_two_ranks_learn_and_equal_the_dense_model(tmp_path, capsys):
    rc, r = train(["--ranks", "2", "--steps", "8", "--check-dense"], tmp_path, capsys)
    assert rc == 0 and (r["dp"], r["ep"]) == (1, 2)
    losses = r["losses"]
    assert len(losses) == len(r["rank_imbalance"]) == len(r["dense_losses"]) == 8
    assert losses[-1] < losses[0] - 0.5  # about 4.65 -> 3.95 on the stdlib's docstrings
    assert r["final_loss"] == losses[-1]
    assert r["dense_last_abs_diff"] < 1e-4 and r["dense_ok"] is True
    assert r["dense_max_abs_diff"] < 1e-4  # every step, not only the last
    assert all(x >= 1.0 for x in r["rank_imbalance"] + r["expert_imbalance"])


@pytest.mark.long  # 25 s; tests/moe/balance/test_online.py checks the same moves in the library
def test_dp_x_ep_with_replicas_and_online_moves_equals_dense(tmp_path, capsys):
    """4 ranks as dp 2 x ep 2, two redundant experts re-placed every 4 steps: the experts and
    their Adam state move between ranks, and training still equals the dense model."""
    argv = ["--ranks", "4", "--ep", "2", "--steps", "8", "--redundant", "2"]
    rc, r = train([*argv, "--rebalance-every", "4", "--check-dense"], tmp_path, capsys)
    assert rc == 0 and (r["dp"], r["ep"]) == (2, 2)
    assert r["dense_max_abs_diff"] < 1e-4
    assert r["losses"][-1] < r["losses"][0]
    assert [x["step"] for x in r["rebalances"]] == [4, 4, 8, 8]  # 2 layers each time
    assert sum(x["moved"] for x in r["rebalances"]) > 0


def test_online_rebalancing_lowers_the_rank_load_imbalance(tmp_path, capsys):
    """Same run, same placement at the start, with and without online EPLB. Training makes
    experts specialise, so the static placement's imbalance grows (measured about 1.25 over
    the second half); rebalancing keeps it near 1.02. Placement never changes the math."""
    argv = ["--ranks", "2", "--steps", "30", "--redundant", "2"]
    rc, static = train(argv, tmp_path, capsys)
    assert rc == 0 and static["rebalances"] == []
    rc, moving = train([*argv, "--rebalance-every", "5"], tmp_path, capsys)
    assert rc == 0 and len(moving["rebalances"]) == 12
    assert moving["losses"] == pytest.approx(static["losses"], abs=1e-5)
    assert moving["rank_imbalance_second_half"] + 0.1 < static["rank_imbalance_second_half"]
    assert all(x["imbalance_after"] <= x["imbalance_before"] for x in moving["rebalances"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "4", "--ep", "3"], "ep=3 does not divide num_ranks=4"),
        (["--ranks", "2", "--redundant", "3"], "num_redundant=3 must be multiples of ep=2"),
        (["--experts", "9"], "n_groups=2 must divide num_experts=9"),
        (["--topk", "5"], "topk=5 exceeds the 4 experts a token can reach"),
        (["--steps", "0"], "0 must be > 0"),
        (["--plot", "loss.txt"], "a figure is written as .png, .svg, .pdf"),
        (["--plot", "/proc/x.png"], "cannot create files in /proc"),
        (["--ranks", "64"], "64 processes"),
    ],
)
def test_bad_arguments_exit_2_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own errors exit from parse_args
        raise SystemExit(main(["ep", "train", *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_timeout_reaches_the_user(tmp_path, capsys):
    plot = str(tmp_path / "p.png")
    assert main(["ep", "train", "--ranks", "2", "--timeout", "0.5", "--plot", plot, "--json"]) == 1
    err = capsys.readouterr().err
    assert "timed out" in err and len(err.strip().splitlines()) == 1, err
