"""``add_env_arguments`` / ``run_env_train``: the flags of ``nobubble rl actor-learner``."""

from __future__ import annotations

import json

import gymnasium  # noqa: F401 - a hard dependency: a broken install fails here
import pytest

from nobubble.cli.rl_env import add_env_arguments, run_env_train
from nobubble.cli.util import ArgumentParser


def _parse(argv: list[str]):  # type: ignore[no-untyped-def]
    parser = ArgumentParser(prog="nobubble rl actor-learner")
    add_env_arguments(parser)
    return parser.parse_args(argv)


def test_a_short_run_prints_json_with_the_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(
        ["--env", "CartPole-v1", "--arch", "sample-factory", "--actors", "1",
         "--envs-per-actor", "4", "--steps", "2000", "--seconds", "30", "--json"]
    )  # fmt: skip
    assert run_env_train(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == "sample-factory" and out["env_steps"] >= 2000
    assert out["ledger"]["whole"] is True
    assert len(out["eval_returns"]) == 20


def test_a_short_run_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2",
                   "--steps", "600", "--seconds", "30"])  # fmt: skip
    assert run_env_train(args) == 0
    captured = capsys.readouterr()
    assert "eval mean return" in captured.out and "ledger" in captured.out
    assert "training seed on CartPole-v1" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "CartPole-v1", "--arch", "a3c"], "arch='a3c' is not an architecture"),
        (["--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
        (["--env", "Pendulum-v1"], "categorical policy needs Discrete"),
        (["--env", "CartPole-v1", "--loss", "dqn"], "loss='dqn'"),
        (["--env", "guess-number", "--arch", "a3c"], "arch='a3c' is not an architecture"),
        (["--env", "guess-number", "--env-option", "high=1"], "high=1 must be an integer >= 2"),
        (["--env", "guess-number", "--env-option", "turns=3"], "options: high, max_turns"),
        (["--env", "guess-number", "--env-option", "high"], "--env-option 'high': write KEY="),
        (["--env", "CartPole-v1", "--env-option", "high=3"], "--env-option is for text envs"),
        (["--env", "rg:no_such_task"], "reasoning-gym has no task 'no_such_task'"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_env_train(_parse(argv)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_negative_count_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit) as e:
        _parse(["--env", "CartPole-v1", "--actors", "0"])
    assert e.value.code == 2


def test_the_subcommand_is_wired_into_the_cli(capsys) -> None:
    from nobubble.cli import main

    rc = main(["rl", "actor-learner", "--env", "CartPole-v1", "--arch", "impala", "--actors",
               "1", "--seconds", "20", "--target-return", "60", "--json"])  # fmt: skip
    assert rc == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["arch"] == "impala" and out["ledger"]["whole"] is True


def test_guess_number_runs_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["--env", "guess-number", "--env-option", "high=5", "--env-option",
                   "max_turns=2", "--actors", "1", "--envs-per-actor", "4", "--steps", "1000",
                   "--target-return", "none", "--json"])  # fmt: skip
    assert run_env_train(args) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["env"] == "guess-number" and out["arch"] == "seed"  # a text run's default arch
    assert out["target_return"] is None and out["env_steps"] >= 1000
    assert len(out["eval_returns"]) == 100 and set(out["eval_returns"]) <= {0.0, 1.0}
    assert "training seed on guess-number" in captured.err


def test_the_target_defaults_to_the_envs_reward_threshold() -> None:
    from nobubble.cli.rl_env import _config

    assert _config(_parse(["--env", "Acrobot-v1"])).target_return == -100.0
    assert _config(_parse(["--env", "CartPole-v1"])).target_return == 475.0
    assert _config(_parse(["--env", "guess-number"])).target_return == 0.8
    assert _config(_parse(["--env", "Acrobot-v1", "--target-return", "none"])).target_return is None
    assert _config(_parse(["--env", "Acrobot-v1", "--target-return", "-80"])).target_return == -80


def test_a_bad_target_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit) as e:
        _parse(["--env", "CartPole-v1", "--target-return", "high"])
    assert e.value.code == 2


def test_arch_all_runs_each_architecture_on_one_budget_and_draws_them(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "curves.png"
    args = _parse(["--env", "CartPole-v1", "--arch", "all", "--actors", "1", "--envs-per-actor",
                   "2", "--steps", "600", "--seconds", "30", "--plot", str(png), "--json"])  # fmt: skip
    assert run_env_train(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["arch"] for r in out["runs"]] == ["impala", "seed", "sample-factory"]
    assert all(r["env_steps"] >= 600 and r["ledger"]["whole"] for r in out["runs"])
    assert out["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_env_train(_parse(["--env", "CartPole-v1", "--plot", str(png)])) == 2
    assert "--plot draws --arch all" in capsys.readouterr().err


def test_rl_train_and_compare_with_an_env_route_to_the_actor_learner(capsys) -> None:
    from nobubble.cli import main
    from nobubble.cli.rl_env import route_env_commands

    assert route_env_commands(["rl", "train", "--env", "X", "--arch", "seed"]) == [
        "rl", "actor-learner", "--env", "X", "--arch", "seed"]  # fmt: skip
    assert route_env_commands(["rl", "compare", "--env=X"]) == [
        "rl", "actor-learner", "--arch", "all", "--env=X"]  # fmt: skip
    assert route_env_commands(["rl", "compare", "--env", "X", "--arch", "seed"])[2:4] == [
        "--env", "X"]  # fmt: skip
    for unchanged in (["rl", "train", "--task", "copy"], ["pp", "run", "--env", "X"], ["rl"]):
        assert route_env_commands(unchanged) == unchanged
    # routed for real: the actor-learner's own checks answer, before any process starts
    assert main(["rl", "train", "--env", "CartPole-v1", "--arch", "a3c"]) == 2
    assert "arch='a3c' is not an architecture" in capsys.readouterr().err
    assert main(["rl", "compare", "--env", "NoSuchEnv-v0"]) == 2
    assert "--env 'NoSuchEnv-v0'" in capsys.readouterr().err
