"""CartPole-v1 with an actor-learner architecture (IMPALA, SEED RL or Sample Factory).

python examples/rl_cartpole.py --arch sample-factory        # to a greedy return of 475
python examples/rl_cartpole.py --arch impala --target 150   # a shorter run
"""

from __future__ import annotations

import argparse

from nobubble.rl import EnvRunConfig, train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="seed", choices=["impala", "seed", "sample-factory"])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    config = EnvRunConfig(
        env="CartPole-v1", arch=args.arch, actors=2, envs_per_actor=8,
        target_return=args.target, time_budget_s=args.seconds,
    )  # fmt: skip

    def show(version: int, metrics: dict[str, float]) -> None:
        if "eval_return" in metrics:
            print(f"version {version}: eval {metrics['eval_return']:.0f}")

    result = train(config, on_step=show)
    print(
        f"{args.arch}: eval return {result.eval_mean_return:.1f} after {result.env_steps} steps "
        f"in {result.wall_s:.1f}s ({result.env_steps_per_s:,.0f} steps/s); "
        f"max staleness {result.staleness_max}; ledger ok: {result.ledger.ok}"
    )


if __name__ == "__main__":  # the actors are processes: guard the entry point
    main()
