"""The running RL system: rollout, reward and training stages, sync / one-step-off / async.

Layers, bottom up: :mod:`.types` (samples, groups, spans), :mod:`.imports` (objects by
import path) and :mod:`.config` (one run's configuration); :mod:`.tasks` (built-in tasks),
:mod:`.task_spec` (any task), :mod:`.rg_task` (reasoning-gym), :mod:`.policy` and
:mod:`.policies` (any causal LM), :mod:`.weight_sync`, :mod:`.checkpoint`; the stages
:mod:`.rollout`, :mod:`.reward` (with :mod:`.remote_reward` and :mod:`.reward_server`),
:mod:`.trainer`; :mod:`.experience` (admission control and
the sample ledger); :mod:`.engines` (local processes or Ray actors) driven by
:mod:`.orchestrator`; :mod:`.report` draws a finished run. Entry point:
:func:`nobubble.rl.train` (:func:`nobubble.rl.system.orchestrator.train`).
"""
