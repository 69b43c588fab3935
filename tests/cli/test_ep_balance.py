"""``ep balance``: table, JSON, plot, one-line errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from nobubble.cli.ep import register
from nobubble.cli.util import ArgumentParser
from tests.moe.balance.eplb_cases import EPLB_PHY2LOG, EPLB_WEIGHT


def run_balance(argv, capsys):
    """Parse like ``nobubble ep`` does and run the handler; returns (rc, stdout)."""
    parser = ArgumentParser(prog="nobubble ep")
    register(parser)
    args = parser.parse_args(["balance", *argv])
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_balance_json_on_eplb_example(tmp_path, capsys):
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps(EPLB_WEIGHT))
    rc, out = run_balance(
        [
            "--experts", "12", "--gpus", "8", "--nodes", "2", "--redundant", "4",
            "--groups", "4", "--weights", str(weights), "--json",
        ],
        capsys,
    )  # fmt: skip
    data = json.loads(out)
    assert rc == 0 and data["phy2log"] == EPLB_PHY2LOG and data["policy"] == "hierarchical"
    for layer, row in enumerate(EPLB_WEIGHT):
        static = [0.0] * 8  # each expert once, in order: expert e on GPU e * 8 // 12
        for e, w in enumerate(row):
            static[e * 8 // 12] += w
        assert data["gpu_load_before"][layer] == pytest.approx(static)
        assert sum(data["gpu_load_after"][layer]) == pytest.approx(sum(row))
        assert data["imbalance"][layer] == pytest.approx(
            max(data["gpu_load_after"][layer]) / (sum(row) / 8)
        )
    assert data["duplicate_gpus"] == [0, 0]


def test_balance_table_and_plot(tmp_path, capsys):
    plot = tmp_path / "eplb.png"
    rc, out = run_balance(
        [
            "--experts", "64", "--gpus", "8", "--nodes", "2", "--redundant", "16",
            "--groups", "4", "--skew", "pareto:2", "--plot", str(plot),
        ],
        capsys,
    )  # fmt: skip
    assert rc == 0 and "max/mean after" in out and "hierarchical" in out
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--experts", "12", "--gpus", "8", "--redundant", "3"], "not a multiple of num_gpus=8"),
        (["--experts", "12", "--gpus", "8", "--nodes", "2", "--groups", "3", "--redundant", "4"],
         "num_groups=3 is not a multiple of num_nodes=2"),
        (["--experts", "12", "--gpus", "4", "--skew", "zipf"], "skew='zipf'"),
    ],
)  # fmt: skip
def test_balance_bad_config_raises_value_error(argv, needle, capsys):
    with pytest.raises(ValueError, match=needle):
        run_balance(argv, capsys)


def test_nobubble_ep_balance_one_line_error_exit_2(tmp_path, capsys):
    from nobubble.cli import main

    rc = main(["ep", "balance", "--experts", "12", "--gpus", "8", "--redundant", "3"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "num_replicas=15 is not a multiple of num_gpus=8" in err
    with pytest.raises(SystemExit) as exit_:  # argparse's input_file refuses it
        main(["ep", "balance", "--experts", "12", "--gpus", "4", "--weights", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "no such file" in err


@pytest.mark.parametrize(
    ("weights", "needle"),
    [
        ("1e308 1 2 3", "a load is not a finite number"),
        ("nan 1 2 3", "a load is not a finite number"),
        ("0 0 0 0", "a row's loads are all zero"),
        ("", "no numbers"),
        ("1 2 3", "has 3 experts per row, num_experts is 4"),
    ],
)
def test_weights_that_cannot_be_balanced_are_refused(weights, needle, tmp_path, capsys):
    from nobubble.cli import main

    path = tmp_path / "w.txt"
    path.write_text(weights)
    rc = main(["ep", "balance", "--experts", "4", "--gpus", "2", "--weights", str(path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err
    rc = main(["ep", "balance", "--experts", "4", "--gpus", "2", "--skew", "zipf:1e308"])
    assert rc == 2 and "finite number > 0" in capsys.readouterr().err
