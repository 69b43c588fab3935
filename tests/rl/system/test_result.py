"""One :class:`RunResult` for both producers: each keeps the JSON it printed before the two
result types became one (the expected values are written out here, not derived)."""

from __future__ import annotations

import math

import pytest

from nobubble.rl.system.experience import LedgerSummary
from nobubble.rl.system.result import RESULT_KEYS, CurvePoint, RunResult, stage_busy
from nobubble.rl.system.types import Span

LEDGER = LedgerSummary(generated=12, trained=8, dropped={"stale": 4}, in_flight=0)


def _task_run() -> RunResult:
    curve = [
        CurvePoint(0, 0.5, train_return=None, eval_return=0.1, accuracy=0.25),
        CurvePoint(3, 4.0, train_return=0.5, eval_return=0.75, accuracy=0.5),
    ]
    return RunResult(
        config={"mode": "sync"}, steps=3, wall_s=4.0, trained_samples=8, curve=curve,
        staleness_hist={1: 6, 0: 2}, idle_ratio={"rollout": 0.5}, ledger=LEDGER,
        initial_accuracy=0.25, final_accuracy=0.5, busy_s={"rollout": 2.0},
        token_staleness_hist={0: 20},
    )  # fmt: skip


def _env_run() -> RunResult:
    curve = [
        CurvePoint(1, 2.0, train_return=None, env_steps=256),
        CurvePoint(2, 5.0, train_return=20.0, eval_return=500.0, env_steps=1024),
    ]
    return RunResult(
        config={"arch": "seed"}, steps=2, wall_s=8.0, trained_samples=8, curve=curve,
        staleness_hist={0: 8}, idle_ratio={"learner": 0.75}, ledger=LEDGER,
        env="CartPole-v1", arch="seed", actors=2, envs_per_actor=8, eval_mean_return=500.0,
        eval_returns=(500.0, 500.0), target_return=475.0, time_to_target_s=5.0,
        steps_to_target=1024, env_steps=1024,
    )  # fmt: skip


def test_a_task_run_prints_accuracy_points_and_its_own_outcome() -> None:
    r = _task_run()
    out = r.to_json()
    assert tuple(out) == RESULT_KEYS
    assert out["curve"] == [
        {"step": 0, "wall_s": 0.5, "accuracy": 0.25, "eval_reward": 0.1, "train_reward": None},
        {"step": 3, "wall_s": 4.0, "accuracy": 0.5, "eval_reward": 0.75, "train_reward": 0.5},
    ]
    assert out["outcome"] == {"initial_accuracy": 0.25, "final_accuracy": 0.5}
    assert out["details"] == {
        "token_staleness_hist": {"0": 20}, "busy_s": {"rollout": 2.0}, "restarts": [],
        "step_metrics": [], "resumed_from": None,
    }  # fmt: skip
    assert out["staleness_hist"] == {"0": 2, "1": 6} and out["staleness_max"] == 1
    assert out["samples_per_s"] == 2.0 and r.time_to_accuracy(0.5) == 4.0
    assert r.env_steps_per_s is None and not r.reached_target


def test_an_env_run_prints_list_points_and_its_eval_return() -> None:
    r = _env_run()
    out = r.to_json()
    assert tuple(out) == RESULT_KEYS
    assert out["curve"] == [[2.0, 256, None, None], [5.0, 1024, 20.0, 500.0]]
    assert out["outcome"] == {
        "eval_mean_return": 500.0, "eval_returns": [500.0, 500.0], "target_return": 475.0,
        "reached_target": True, "time_to_target_s": 5.0, "steps_to_target": 1024,
    }  # fmt: skip
    assert out["details"] == {
        "env": "CartPole-v1", "arch": "seed", "env_steps": 1024, "env_steps_per_s": 128.0,
    }  # fmt: skip
    assert out["samples_per_s"] == 1.0 and r.staleness_max == 0
    assert r.time_to_accuracy(0.0) is None  # an env run has no accuracy
    assert math.isclose(r.idle_ratio["learner"], 0.75)


def test_one_plot_draws_either_producers_runs(tmp_path) -> None:
    from nobubble.rl.system.result import plot_runs

    for label, run in (("task", _task_run()), ("env", _env_run())):
        png = plot_runs({label: run, f"{label} again": run}, tmp_path / f"{label}.png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stage_busy_is_the_union_of_each_stages_spans_within_the_run():
    spans = [
        Span("rollout", "g0", 99.0, 102.0),  # starts before the run: 2 s inside it
        Span("rollout", "g1", 101.0, 103.0),  # overlaps the first: 1 s more
        Span("reward", "r0", 105.0, 107.0),  # ends after the run: 0.5 s inside it
        Span("trainer", "t0", 90.0, 95.0),  # before the run
    ]
    busy, idle = stage_busy(spans, 100.0, 105.5)
    assert busy == pytest.approx({"rollout": 3.0, "reward": 0.5, "trainer": 0.0})
    assert idle == pytest.approx({"rollout": 1 - 3 / 5.5, "reward": 1 - 0.5 / 5.5, "trainer": 1.0})
