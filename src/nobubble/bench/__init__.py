"""Measuring code shared by ``benchmarks/`` and the command line: each module runs a baseline
and the path it measures in the same processes and returns results ready for JSON; how they
are shown (:mod:`.output`, :mod:`.ep_tables`, :mod:`.pp_tables`, :mod:`.rl_tables`) lives here
too, one copy.
"""
