"""Execute pipeline schedules on a real PyTorch model across processes.

- :mod:`.runner`: :class:`~nobubble.pipeline.runtime.runner.PipelineRunner`, any schedule on
  the user's own ``nn.Module`` stages from the user's own loop; :mod:`.autosplit`: the B/W
  split of any module (the one stage executor: F, B, W, fused BW, recompute, for the runner
  and the profiler); :mod:`.messages`: transfers that carry their shape; :mod:`.torch_interop`:
  the schedule on ``torch.distributed.pipelining``'s runtime.
- :mod:`.planning`: :func:`~nobubble.pipeline.runtime.planning.plan`, the cut, schedule,
  microbatch count and recompute chosen for the user's own blocks from their measured costs.

- :mod:`.models`: a small GPT and a residual MLP as lists of blocks, split into stages (their
  configs import no torch; the layers are :mod:`.layers`).
- :mod:`.bw_split`: the deferred linear: B computes dX, W computes dW from the kept (X, dY).
- :mod:`.executor`: the built-in models on the runner, one config per run, traced.
- :mod:`.profile`: the one profiler, per module (a stage or a block) on the runner's path:
  costs for the simulator, ``pp profile | run | plan`` and the planner; :mod:`.profile_data`:
  the measured costs as data and their JSON file, read and written without torch.
- :mod:`.launch`: :func:`~nobubble.pipeline.runtime.launch.run_local` on local processes;
  :mod:`.report`, :mod:`.plot_run`: measured step next to the simulator's prediction.
- :mod:`.channel`: the one point-to-point channel (static order or handshake, headers with
  key and shape, none once static shapes are known); :mod:`.cursor`: the one loop of a
  rank's step (static = the row's fixed order, or the handshake rule).
- :mod:`.hooks`: what the runner calls besides the stages: ``observer=`` around every
  action (:class:`~nobubble.pipeline.runtime.hooks.StragglerObserver`, a really slow rank)
  and ``hooks=`` around every step:
  :class:`~nobubble.pipeline.runtime.optim.PostValidatedOptimizer` (the optimizer step
  without its wait for the global gradient check) and
  :class:`~nobubble.pipeline.runtime.elastic.Replanner` (the layers re-cut over the ranks
  from live per-rank costs while training).

The command line (``nobubble pp profile | plan | run``) is :mod:`nobubble.cli.pp.run`.
"""
