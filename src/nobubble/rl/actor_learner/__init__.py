"""Actor-learner RL on gymnasium and text environments: IMPALA, SEED RL and Sample Factory on
one core.

Modules, bottom up: :mod:`.config` (one run), :mod:`.envs` (gymnasium by id or factory, a
step delay, a vector of envs), :mod:`.model` (the model contract, the MLP actor-critic),
:mod:`.trajectory`, :mod:`.loss` (V-trace + PPO clip), :mod:`.rollout`
(an actor's unroll, evaluation), :mod:`.shm` and :mod:`.inference` (central batched
inference), :mod:`.actors` and :mod:`.launch` (the processes), :mod:`.run` (the loop; it
returns the one :class:`~nobubble.rl.system.result.RunResult`). :mod:`.text` adds multi-turn
text environments (the model speaks a turn, the env replies) and the character policy for them.

Entry point: :func:`nobubble.rl.train` (``train(EnvRunConfig(env="CartPole-v1",
arch="seed")) -> RunResult``, or ``train(text_run_config(MyTextEnv))``), which calls
:func:`.run.run`; ``EnvRunConfig`` and ``WorkerError`` are exported by :mod:`nobubble.rl`.
Importing this package loads no torch.
"""
