"""The library's checks of an RL run raise the ValueError the command line prints."""

from __future__ import annotations

import pytest

from nobubble.budget import check_budget, check_steps
from nobubble.imports import load_user_object
from nobubble.rl.entry import env_config, import_run_objects, serve_reward


def test_env_config_refuses_a_bad_option_and_options_of_a_gymnasium_id() -> None:
    with pytest.raises(ValueError, match=r"--env-option 'high': write KEY=VALUE, e.g. max_turns=4"):
        env_config("guess-number", ["high"])
    with pytest.raises(ValueError, match=r"--env-option is for text envs; 'CartPole-v1' is a"):
        env_config("CartPole-v1", ["high=9"])


def test_env_config_reads_json_options_and_the_specs_threshold() -> None:
    assert env_config("guess-number", ["high=9"]).target_return == 0.8  # the text envs' success
    assert env_config("CartPole-v1").target_return == 475.0
    assert env_config("CartPole-v1", target_return=None).target_return is None


def test_a_module_that_fails_to_import_is_one_value_error(tmp_path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"--task .*importing it raised RuntimeError: boom"):
        load_user_object("--task", f"{tmp_path / 'broken.py'}:TASK", "task")
    (tmp_path / "refuses.py").write_text("raise ValueError('bad setting in the module')\n")
    with pytest.raises(
        ValueError, match=r"--task .*refuses.py:TASK: importing it raised ValueError"
    ):
        load_user_object("--task", f"{tmp_path / 'refuses.py'}:TASK", "task")


def test_run_objects_are_imported_by_flag_and_built_in_specs_are_not(tmp_path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "fine.py").write_text("def OBJ(prompt, response):\n    return 1.0\n")
    broken = f"{tmp_path / 'broken.py'}:OBJ"
    # no module 'rg' or 'hf'; the weight is no part of the reward's name
    import_run_objects(
        "rg:chain_sum", "hf:checkpoint", ("task=2", f"{tmp_path / 'fine.py'}:OBJ=0.5")
    )
    for flag, given in [
        ("--task", {"task": broken}),
        ("--policy", {"policy": broken}),
        ("--reward", {"rewards": ("task", f"{broken}=0.5")}),
    ]:
        with pytest.raises(ValueError, match=rf"^{flag} .*importing it raised RuntimeError"):
            import_run_objects(**given)


def test_budgets_and_the_reward_port_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"rl: 100000 processes on \d+ cores"):
        check_budget("rl", processes=100_000)
    with pytest.raises(ValueError, match=r"--steps 10000000000 takes at least .* --force"):
        check_steps("rl", "--steps", 10**10, 0.01)
    for port in (70000, -1):  # -1: socket's own refusal would be an OverflowError
        with pytest.raises(ValueError, match=rf"--port {port} must be in 0..65535"):
            serve_reward(task="digits", port=port)
