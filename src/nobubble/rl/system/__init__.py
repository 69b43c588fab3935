"""The running RL system: rollout, reward and training stages, sync / one-step-off / async.

Layers, bottom up: :mod:`.types` (samples, groups, spans), :mod:`.imports` (objects by
import path) and :mod:`.config` (one run's configuration); :mod:`.tasks` (built-in tasks,
any task, reasoning-gym), :mod:`.policies` (the char transformer, any causal LM, sampling),
:mod:`.weight_sync`, :mod:`.checkpoint`; the stages :mod:`.rollout`, :mod:`.rewards`
(weighted sources, a remote service), :mod:`.trainer`; :mod:`.experience` (admission control and
the sample ledger); :mod:`.engines` (local processes or Ray actors) driven by
:mod:`.orchestrator`, which returns a :mod:`.result`; :mod:`.report` draws a finished run. Entry point:
:func:`nobubble.rl.train` (:func:`nobubble.rl.system.orchestrator.run`).
"""
