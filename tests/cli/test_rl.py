"""``nobubble rl``: JSON output, artifacts, one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main

TINY = ["--steps", "2", "--batch-groups", "2", "--group-size", "4", "--eval-every", "1"]
BAD = "tests/rl/system/user_files/bad_rewards.py"
MINE = "tests/rl/system/user_files/my_rl.py"


def test_train_json_has_the_promised_fields(tmp_path, capsys):
    rc = main(
        [
            "rl",
            "train",
            "--mode",
            "fully-async",
            "--max-staleness",
            "2",
            *TINY,
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    from nobubble.rl.system.result import RESULT_KEYS

    assert set(out) == {*RESULT_KEYS, "artifacts"}  # the same keys as an --env run
    assert 0 <= out["outcome"]["final_accuracy"] <= 1
    assert out["steps"] == 2 and out["staleness_max"] <= 2
    assert out["ledger"]["ok"]
    trace = json.loads((tmp_path / "train_fully-async_fully-async_trace.json").read_text())
    names = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {"rollout", "reward", "trainer"}
    assert (tmp_path / "train_fully-async.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["rl", "train", "--steps", "0"], "--steps: 0 must be > 0"),
        (["rl", "train", "--mode", "fast"], "invalid choice: 'fast'"),
        (["rl", "train", "--mode", "sync", "--max-staleness", "3"], "max_staleness=0"),
        (["rl", "train", "--reward", f"{BAD}:no_arguments"], "must take (prompt, response)"),
        # a flag that would be ignored, or can never act, is refused naming it
        (["rl", "train", "--group-size", "1"], "group_size=1 with algo='grpo'"),
        (
            [
                "rl",
                "train",
                "--mode",
                "fully-async",
                "--max-staleness",
                "2",
                "--drop-staleness",
                "10",
            ],
            "drop_staleness=10 > max_staleness=2",
        ),  # fmt: skip
        (
            ["rl", "train", "--replay-groups", "2"],
            "--replay-groups 2: replay capacity=0 / groups_per_step=2 are read",
        ),
        (["rl", "train", "--address", "127.0.0.1:1"], "ray_address is read only with engine"),
        (["rl", "compare", "--etas", "4,8"], "--etas is read only with --ablation"),
        (["rl", "train", "--resume", "--checkpoint-dir", "{tmp}/empty"], "holds no checkpoint"),
        (["rl", "train", "--resume", "--resume-or-start"], "not allowed with argument"),
        # a factory's unknown settings are named with the ones it takes
        (["rl", "train", "--task-kwargs", '{"bogus": 1}'], "DigitsTask takes no 'bogus'; it"),
        (["rl", "train", "--policy-kwargs", '{"bogus": 1}'], "PolicyConfig takes no 'bogus'"),
        (
            ["rl", "train", "--policy", f"{MINE}:make_gru", "--policy-kwargs", '{"bogus": 1}'],
            "make_gru takes no 'bogus'",
        ),  # fmt: skip
        (["rl", "reward-server", "--reward", f"{BAD}:no_arguments"], "must take (prompt, resp"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = main([*argv, "--out", str(tmp_path / "out")] if argv[1] != "reward-server" else argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("reward", "needle"),
    [
        (["--reward-failure-rate", "1"], "RewardFailure: injected failure"),
        (["--reward", f"{BAD}:nan_reward"], "returned nan, not a finite number"),
        (["--reward", f"{BAD}:text_reward"], "returned 'good', not a finite number"),
    ],
)
def test_a_reward_that_never_succeeds_ends_the_run_with_one_line(reward, needle, tmp_path, capsys):
    argv = ["rl", "train", "--steps", "50", "--batch-groups", "2", "--group-size", "2"]
    rc = main([*argv, *reward, "--out", str(tmp_path), "--json"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert "all of the last 8 groups failed" in err and needle in err


def test_a_live_runs_output_is_refused_before_torch_is_imported(tmp_path):
    """The claim comes first: a second ``rl train`` on a live run's folder is refused without
    the seconds of start-up (torch, the task, the policy) the run would spend first."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])  # the live run holding the folder
    try:
        (tmp_path / ".out.lock").write_text(f"{sleeper.pid}\n")
        code = ("import sys; from nobubble.cli import main; "
                f"rc = main(['rl', 'train', '--out', {str(out)!r}]); "
                "print(rc, 'torch' in sys.modules)")  # fmt: skip
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr)
    assert f"another live run (pid {sleeper.pid})" in r.stderr


def test_preset_then_the_flags_given_with_it():
    """``--preset`` is applied first and the lag flags given with it are laid over its
    config, so they win - even one that names the default (``--staleness-weighting none``)
    or turns the preset's replay off (its sizes go with it)."""
    from nobubble.cli import build_parser
    from nobubble.cli.rl import run_config

    def config(*flags: str):
        return run_config(build_parser().parse_args(["rl", "train", *TINY, *flags]))

    fast = ["--mode", "fully-async", "--preset", "aggressive"]
    cfg = config(*fast)
    assert (cfg.algo, cfg.effective_max_staleness, cfg.replay.mode) == (
        "decoupled-ppo",
        8,
        "prioritized",
    )
    assert cfg.trainer.staleness_weighting == "inverse"
    mine = config(*fast, "--max-staleness", "3", "--algo", "grpo", "--replay", "none",
                  "--staleness-weighting", "none", "--trainer-delay", "0.1")  # fmt: skip
    assert (mine.algo, mine.effective_max_staleness, mine.replay.mode) == ("grpo", 3, "none")
    assert (mine.replay.capacity, mine.replay.groups_per_step) == (0, 0)
    assert mine.trainer.staleness_weighting == "none" and mine.trainer.delay_s == 0.1
    assert config(*fast, "--drop-staleness", "6").effective_drop_staleness == 6  # bound 8
    cons = config("--mode", "one-step-off", "--preset", "conservative")
    assert (cons.algo, cons.effective_max_staleness, cons.replay.mode) == ("grpo", 1, "none")
