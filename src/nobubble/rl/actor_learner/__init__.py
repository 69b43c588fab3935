"""Actor-learner RL on gymnasium and text environments: IMPALA, SEED RL and Sample Factory on
one core (the layout: ``docs/rl/actor-learner.md``).

Entry point: :func:`nobubble.rl.train` (``train(EnvRunConfig(env="CartPole-v1",
arch="seed")) -> RunResult``, or ``train(text_run_config(MyTextEnv))``), which calls
:func:`.run.run`. Importing this package loads no torch.
"""
