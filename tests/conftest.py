"""Test-suite settings: hypothesis profiles, the two tiers, and the one Ray session.

Hypothesis runs derandomized: every run (CI included) draws the same examples, so a red
build always reproduces; ``HYPOTHESIS_PROFILE=explore`` (``make test-explore``) draws fresh
random examples, more of them.

Tiers: ``make test`` runs every test not marked ``long``; ``make test-long`` runs the
``long`` ones (learning to a target, the full fault matrix, accepted-size budgets, solver
proofs, behaviour driven by wall-clock time). Hypothesis tests are marked ``property``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        if "ray_session" in getattr(item, "fixturenames", ()):
            # with pytest-xdist (make test: -n 2 --dist loadgroup), every Ray test runs on one
            # worker, so the run starts Ray once
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """The test run's one local Ray instance, every process of it on 127.0.0.1 (Ray starts
    slowly, and binds every interface unless kept on loopback: the engine's
    ``start_local_ray``). Four logical CPUs: a generator and two learners fit, with one to
    spare."""
    import ray  # the [ray] extra: make installs it, so a missing one fails loudly

    from nobubble.rl.system.engines.ray import start_local_ray

    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(num_cpus=4)
    try:
        yield ray
    finally:
        ray.shutdown()
