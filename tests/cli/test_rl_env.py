"""``nobubble rl train|compare --env``: the environment producer behind the one RL command."""

from __future__ import annotations

import json

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest

from nobubble.cli import main
from nobubble.rl.system.result import RESULT_KEYS


def _train(tmp_path, *argv: str) -> int:  # type: ignore[no-untyped-def]
    """The exit status of ``nobubble rl train ARGV`` (argparse's refusals exit too)."""
    try:
        return main(["rl", "train", *argv, "--out", str(tmp_path / "out")])
    except SystemExit as e:
        return int(e.code or 0)


def test_a_short_run_prints_json_with_every_runs_keys(tmp_path, capsys) -> None:
    rc = _train(tmp_path, "--env", "CartPole-v1", "--arch", "sample-factory", "--actors", "1",
                "--envs-per-actor", "4", "--env-steps", "2000", "--time-budget", "30",
                "--max-staleness", "2", "--json")  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {*RESULT_KEYS, "artifacts"}  # the same keys as a --task run
    assert out["details"]["arch"] == "sample-factory" and out["details"]["env_steps"] >= 2000
    assert out["ledger"]["ok"] is True and out["staleness_max"] <= 2
    assert out["config"]["max_staleness"] == 2 and out["config"]["time_budget_s"] == 30
    assert len(out["outcome"]["eval_returns"]) == 20
    assert (tmp_path / "out" / "train_sample-factory.png").read_bytes()[:4] == b"\x89PNG"


def test_steps_are_learner_updates_on_the_env_path_too(tmp_path, capsys) -> None:
    rc = _train(tmp_path, "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2",
                "--steps", "3", "--target-return", "none", "--json")  # fmt: skip
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3


def test_a_short_run_prints_a_table(tmp_path, capsys) -> None:
    rc = _train(tmp_path, "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2",
                "--env-steps", "600", "--time-budget", "30")  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    assert "eval mean return" in captured.out and "ledger" in captured.out
    assert "training seed on CartPole-v1" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "CartPole-v1", "--arch", "a3c"], "invalid choice: 'a3c'"),
        (["--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
        (["--env", "Pendulum-v1"], "categorical policy needs Discrete"),
        (["--env", "CartPole-v1", "--loss", "dqn"], "invalid choice: 'dqn'"),
        (["--env", "guess-number", "--env-option", "high=1"], "high=1 must be an integer >= 2"),
        (["--env", "guess-number", "--env-option", "turns=3"], "options: high, max_turns"),
        (["--env", "guess-number", "--env-option", "high"], "--env-option 'high': write KEY="),
        (["--env", "CartPole-v1", "--env-option", "high=3"], "--env-option is for text envs"),
        (["--env", "rg:no_such_task"], "reasoning-gym has no task 'no_such_task'"),
        (["--env", "CartPole-v1", "--actors", "0"], "--actors"),
        (["--env", "CartPole-v1", "--target-return", "high"], "'high' is not a number"),
        # a flag the chosen producer would ignore names both
        (["--env", "CartPole-v1", "--mode", "fully-async"], "--mode is not read with --env"),
        (["--env", "CartPole-v1", "--group-size", "4"], "--group-size is not read with --env"),
        (["--env", "CartPole-v1", "--resume"], "--resume is not read with --env"),
        (["--env", "CartPole-v1", "--token-delay", "1"], "--token-delay is not read with --env"),
        (["--env", "CartPole-v1", "--task", "digits"], "--task and --env pick two producers"),
        (["--env", "CartPole-v1", "--engine", "ray"], "--engine is not read with --env"),
        (["--task", "digits", "--actors", "2"], "--actors is not read with --task"),
        (["--env-steps", "100"], "--env-steps is not read with --task"),
        # sizes past the machine's budget, refused before any actor starts
        (["--env", "CartPole-v1", "--actors", "1000"], "1001 processes on"),
        (["--env", "CartPole-v1", "--envs-per-actor", "1000000"], "GiB, past 80% of"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(tmp_path, argv, message, capsys) -> None:
    assert _train(tmp_path, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_target_defaults_to_the_envs_reward_threshold(tmp_path) -> None:
    from nobubble.cli.rl import register, run_config
    from nobubble.cli.util import ArgumentParser

    parser = ArgumentParser(prog="nobubble rl")
    register(parser)

    def target(*argv: str) -> float | None:
        args = parser.parse_args(["train", *argv])
        return run_config(args).target_return

    assert target("--env", "Acrobot-v1") == -100.0
    assert target("--env", "CartPole-v1") == 475.0
    assert target("--env", "guess-number") == 0.8
    assert target("--env", "Acrobot-v1", "--target-return", "none") is None
    assert target("--env", "Acrobot-v1", "--target-return", "-80") == -80


def test_guess_number_runs_from_the_command_line(tmp_path, capsys) -> None:
    rc = _train(tmp_path, "--env", "guess-number", "--env-option", "high=5", "--env-option",
                "max_turns=2", "--actors", "1", "--envs-per-actor", "4", "--env-steps", "1000",
                "--target-return", "none", "--json")  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["details"]["env"] == "guess-number" and out["details"]["arch"] == "seed"
    assert out["outcome"]["target_return"] is None and out["details"]["env_steps"] >= 1000
    returns = out["outcome"]["eval_returns"]
    assert len(returns) == 100 and set(returns) <= {0.0, 1.0}
    assert "training seed on guess-number" in captured.err


def test_compare_runs_each_architecture_on_one_budget_and_draws_them(tmp_path, capsys) -> None:
    rc = main(["rl", "compare", "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2",
               "--env-steps", "600", "--time-budget", "30", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["runs"]) == ["impala", "seed", "sample-factory"]
    runs = out["runs"].values()
    assert all(r["details"]["env_steps"] >= 600 and r["ledger"]["ok"] for r in runs)
    png = tmp_path / "compare.png"
    assert out["runs"]["seed"]["artifacts"]["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_prints_one_row_per_architecture_and_the_seed(capsys) -> None:
    from nobubble.bench.rl_tables import render_runs
    from nobubble.rl.actor_learner.config import ARCHS
    from nobubble.rl.system.experience import LedgerSummary
    from nobubble.rl.system.result import RunResult

    ledger = LedgerSummary(generated=8, trained=8, dropped={}, in_flight=0)
    results = [
        RunResult(config={"seed": 3}, steps=2, wall_s=4.0, trained_samples=8, curve=[],
                  staleness_hist={1: 8}, idle_ratio={"learner": 0.5}, ledger=ledger,
                  env="CartPole-v1", arch=arch, eval_mean_return=42.0, target_return=475.0,
                  env_steps=400)
        for arch in ARCHS
    ]  # fmt: skip
    render_runs("CartPole-v1 (seed 3)", {r.arch: r for r in results}, {}, as_json=False,
                compare=True)  # fmt: skip
    out = capsys.readouterr().out
    assert "(seed 3)" in out and all(arch in out for arch in ARCHS)
    assert out.count("100") == 3  # env steps/s of each
