"""The running RL system (tasks, policy, reward; sync / one-step-off / fully-async): the
stages :mod:`.rollout`, :mod:`.rewards` and :mod:`.learner` on :mod:`.engines` (local
processes or Ray actors), driven by :mod:`.orchestrator`. Entry point: :func:`nobubble.rl.train`.
"""
