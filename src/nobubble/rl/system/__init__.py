"""The running RL system: rollout, reward and training stages, sync / one-step-off / async.

Layers, bottom up: :mod:`.types` (samples, groups, spans) and :mod:`.config` (one run's
configuration); :mod:`.tasks`, :mod:`.policy`, :mod:`.weight_sync`; the stages
:mod:`.rollout`, :mod:`.reward`, :mod:`.trainer`; :mod:`.experience` (admission control and
the sample ledger); :mod:`.engines` (local processes or Ray actors) driven by
:mod:`.orchestrator`; :mod:`.report` draws a finished run. Entry point:
:func:`nobubble.rl.system.orchestrator.run`.
"""
