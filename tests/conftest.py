"""Test-suite settings.

Hypothesis runs derandomized: every run (CI included) draws the same examples, so a red
build always reproduces; ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples instead.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
