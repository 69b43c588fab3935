"""Execute pipeline schedules on a real PyTorch model across processes: the runner
(:mod:`.runner`), the one stage executor (:mod:`.autosplit`), the one channel
(:mod:`.channel`) and step loop (:mod:`.cursor`), the one profiler (:mod:`.profile`), the
planner (:mod:`.planning`), hooks (:mod:`.hooks`, :mod:`.optim`, :mod:`.elastic`) and the
built-in models (:mod:`.models`, :mod:`.executor`). The command line is :mod:`nobubble.cli.pp`.
"""
