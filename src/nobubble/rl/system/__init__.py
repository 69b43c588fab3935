"""The running RL system: rollout, reward and training stages, sync / one-step-off / async.

Layers, bottom up: :mod:`.types`, :mod:`.imports` and :mod:`.config`; :mod:`.tasks`,
:mod:`.policies`, :mod:`.weight_sync`, :mod:`.checkpoint`; the stages :mod:`.rollout`,
:mod:`.rewards`, :mod:`.trainer`; :mod:`.experience` (admission control and the sample
ledger); :mod:`.engines` (local processes or Ray actors) driven by :mod:`.orchestrator`,
which returns a :mod:`.result`; :mod:`.report` draws a finished run. Entry point:
:func:`nobubble.rl.train`.
"""
