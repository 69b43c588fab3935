"""Experience buffer: AReaL admission, oldest-first batches, staleness bound, the ledger."""

from __future__ import annotations

import pickle
from dataclasses import fields, replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nobubble.rl.system.experience import ExperienceBuffer, GroupState, LedgerError
from nobubble.rl.system.types import Sample, SampleGroup


def _group(gid: int, version: int, size: int = 2, failed: bool = False) -> SampleGroup:
    samples = tuple(
        Sample(
            sample_id=gid * size + i,
            group_id=gid,
            prompt_id=0,
            prompt="p",
            response="r",
            tokens=torch.zeros(3, dtype=torch.long),
            response_mask=torch.ones(1, dtype=torch.bool),
            behaviour_logprobs=torch.zeros(1),
            policy_version=version,
            reward=None if failed else 0.5,
            reward_error="boom" if failed else None,
            t_scored=1.0,
        )
        for i in range(size)
    )
    return SampleGroup(gid, 0, samples)


def test_admission_eta0_is_synchronous():
    buf = ExperienceBuffer(batch_groups=2, max_staleness=0)
    buf.admit(0, 0)
    buf.admit(1, 0)
    assert not buf.can_admit(0)  # group 3 belongs to step 1: wait for version 1
    assert buf.can_admit(1)
    with pytest.raises(ValueError, match="refused"):
        buf.admit(2, 0)


def test_admission_formula_matches_areal():
    """floor((N_r - 1) / B) <= version + eta, checked against the formula directly."""
    for b in (1, 3, 4):
        for eta in (0, 1, 4):
            for version in (0, 2):
                buf = ExperienceBuffer(batch_groups=b, max_staleness=eta)
                n = 0
                while buf.can_admit(version):
                    buf.admit(n, version)
                    n += 1
                # n groups admitted: the n-th passed, the (n+1)-th fails the formula
                assert (n - 1) // b <= version + eta < n // b


def test_a_request_is_admitted_whole_while_its_last_group_fits():
    """can_admit(version, n) (one-step-off and sync admit a request of n groups whole)
    against the capacity form of the rule: B x (version + eta + 1) groups may be live."""
    for b, eta, version in [(1, 0, 0), (3, 1, 0), (4, 2, 1)]:
        buf = ExperienceBuffer(batch_groups=b, max_staleness=eta)
        for live in range(b * (version + eta + 1) + 1):
            for n in range(1, 2 * b + 2):
                assert buf.can_admit(version, n) == (live + n <= b * (version + eta + 1))
            if buf.can_admit(version):
                buf.admit(live, version)


def test_mixed_group_is_rejected():
    g = _group(0, 1)
    bad = g.samples[0].__class__(**{**g.samples[0].__dict__, "policy_version": 2})
    with pytest.raises(ValueError, match="mixes policy versions"):
        SampleGroup(0, 0, (g.samples[1], bad))


def test_a_pickled_group_comes_back_field_by_field():
    """Pickling packs a group into stacked arrays; every field of every sample returns, with
    and without per-token versions, a failed reward included."""
    group = replace(_group(3, 2), t_admitted=9.0, weight_digests=((2, "ab"),), generator="g1")
    ok, bad = group.samples
    ok = replace(ok, tokens=torch.arange(3), behaviour_logprobs=torch.tensor([-0.5]))
    bad = replace(bad, response="q", reward=None, reward_error="boom", t_generated=4.0)
    for versions in (None, torch.tensor([3])):
        samples = tuple(replace(s, token_versions=versions) for s in (ok, bad))
        back = pickle.loads(pickle.dumps(group.with_samples(samples)))
        assert (back.group_id, back.prompt_id, back.t_admitted) == (3, 0, 9.0)
        assert (back.weight_digests, back.generator) == (((2, "ab"),), "g1")
        for want, got in zip(samples, back.samples, strict=True):
            for f in fields(want):
                x, y = getattr(want, f.name), getattr(got, f.name)
                if isinstance(x, torch.Tensor):
                    assert x.dtype == y.dtype and torch.equal(x, y), f.name
                else:
                    assert x == y, f.name


def test_reward_failure_drops_group_and_frees_admission():
    buf = ExperienceBuffer(batch_groups=1, max_staleness=0)
    buf.admit(0, 0)
    g = _group(0, 0, failed=True)
    buf.generated(g)
    assert not buf.can_admit(0)
    buf.put(g)
    assert buf.fate == {0: "dropped:reward_failed", 1: "dropped:reward_failed"}
    assert buf.can_admit(0)  # the dropped group no longer counts


def _ledger() -> ExperienceBuffer:
    """A buffer that admits on arrival: its ledger alone is under test."""
    return ExperienceBuffer(batch_groups=1, max_staleness=0, admit_on_arrival=True)


def test_ledger_refuses_second_fate_and_bad_transitions():
    led = _ledger()
    led.admit(0, 0)
    with pytest.raises(ValueError, match="illegal transition"):
        led.mark_trained([_group(0, 0)], 1)
    led.move(0, GroupState.GENERATED, (0, 1))
    with pytest.raises(ValueError, match="not a stated policy"):
        led.dropped(0, "because")
    with pytest.raises(ValueError, match="admitted twice"):
        led.admit(0, 0)


def _arrive(led: ExperienceBuffer, gid: int, source: str, seq: int) -> None:
    """An environment trajectory: one group of one sample, numbered by its source."""
    led.admit(gid, 0, source=(source, seq))
    led.move(gid, GroupState.GENERATED, (gid,))
    led.move(gid, GroupState.SCORED)


def test_numbered_sources_make_a_whole_ledger_when_each_has_one_fate():
    led = _ledger()
    for seq in range(4):
        _arrive(led, seq, "actor-0", seq)
    led.mark_trained([_group(0, 0, size=1)], 1)
    led.mark_trained([_group(1, 0, size=1)], 1)
    led.dropped(2, "stale")
    led.dropped(3, "unfinished")
    summary = led.check()
    assert (summary.generated, summary.trained, summary.ok) == (4, 2, True)
    assert summary.dropped == {"stale": 1, "reward_failed": 0, "unfinished": 1, "synced": 0}


def test_a_group_in_flight_or_a_gap_in_a_source_breaks_the_ledger():
    led = _ledger()
    _arrive(led, 0, "a", 0)
    with pytest.raises(LedgerError, match="neither trained nor dropped"):
        led.check()
    led.mark_trained([_group(0, 0, size=1)], 1)
    _arrive(led, 1, "a", 2)  # the source's trajectory 1 never arrived
    led.mark_trained([_group(1, 0, size=1)], 1)
    assert not led.summary().ok and led.summary().gaps == ("a",)
    with pytest.raises(LedgerError, match="gaps"):
        led.check()
    with pytest.raises(LedgerError, match="illegal transition trained -> trained"):
        led.mark_trained([_group(1, 0, size=1)], 2)
    restored = _ledger()  # a checkpoint pickles the buffer's state_dict
    restored.load_state_dict(pickle.loads(pickle.dumps(led.state_dict())))
    assert restored.summary() == led.summary()  # sources survive a checkpoint


def test_every_attribute_of_the_buffer_is_checkpointed_or_a_setting():
    """A field added to the buffer joins its checkpoint (``CHECKPOINTED``) or is a setting of
    the constructor (``SETTINGS``); the ready groups are saved apart (``"ready"``). Checked on
    a buffer that has been through every call, so a field made later shows too."""
    buf = ExperienceBuffer(batch_groups=1, max_staleness=2)
    for gid in range(3):
        buf.admit(gid, 0, source=("a", gid))
    for gid in range(2):
        buf.generated(_group(gid, 0))
        buf.put(_group(gid, 0))
    batch = buf.take_batch(0)
    assert batch is not None
    buf.mark_trained(batch, 1, {batch[0].group_id: 0})
    buf.reused(batch[0], 2)
    buf.requeue(2, "resumed")
    buf.dropped(2, "stale")
    buf.close([])
    declared = [*ExperienceBuffer.CHECKPOINTED, *ExperienceBuffer.SETTINGS, "_ready"]
    assert sorted(vars(buf)) == sorted(declared)  # each once: none left out, none twice


def test_admission_on_arrival_never_refuses_and_the_staleness_rule_holds_at_consumption():
    """An environment producer: actors unroll without asking to start, each trajectory one
    group of one sample numbered by its actor. The buffer admits each on arrival, past the
    AReaL bound (B x (version + max_staleness + 1) = 4 groups here), and applies the one
    staleness rule when a batch is taken: older than trainer version - max_staleness drops."""
    buf = ExperienceBuffer(batch_groups=2, max_staleness=1, admit_on_arrival=True)
    arrivals = [0, 0, 0, 1, 2, 2]  # policy version of each trajectory, in arrival order
    for gid, version in enumerate(arrivals):
        assert buf.can_admit(0)
        buf.admit(gid, version, source=("actor-0", gid))
        g = _group(gid, version, size=1)  # sample id = group id
        buf.generated(g)
        buf.put(g)
    batch = buf.take_batch(2)  # floor 2 - 1 = 1: the three of version 0 are stale
    assert batch is not None and [g.group_id for g in batch] == [3, 4]  # oldest first
    buf.mark_trained(batch, 3)
    assert buf.take_batch(3) is None  # one fresh trajectory left: not a batch
    buf.close([])
    assert buf.check().ok
    assert buf.fate == {
        0: "dropped:stale", 1: "dropped:stale", 2: "dropped:stale",
        3: "trained@3", 4: "trained@3", 5: "dropped:unfinished",
    }  # fmt: skip
    asking = ExperienceBuffer(batch_groups=2, max_staleness=1)  # workers that ask to start
    for gid in range(4):
        asking.admit(gid, 0)
    assert not asking.can_admit(0)  # the fifth waits for version 1


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4),
    eta=st.integers(0, 4),
    choices=st.lists(st.integers(0, 9), min_size=5, max_size=120),
)
def test_simulated_run_keeps_every_invariant(b, eta, choices):
    """A random interleaving of generation, scoring and training (one generator that picks
    up the newest weights per group, groups finishing out of order) against the rules."""
    buf = ExperienceBuffer(batch_groups=b, max_staleness=eta)
    version, next_gid = 0, 0
    in_flight: list[SampleGroup] = []
    trained_staleness = []
    for c in choices:
        if c < 4 and buf.can_admit(version):
            buf.admit(next_gid, version)
            g = _group(next_gid, version, failed=(c == 0 and next_gid % 5 == 0))
            buf.generated(g)
            in_flight.append(g)
            next_gid += 1
        elif c < 7 and in_flight:
            buf.put(in_flight.pop(c % len(in_flight)))
        else:
            batch = buf.take_batch(version)
            if batch is not None:
                assert len(batch) == b
                trained_staleness += [version - g.policy_version for g in batch]
                oldest = [(g.policy_version, g.group_id) for g in batch]
                assert oldest == sorted(oldest)
                version += 1
                buf.mark_trained(batch, version)
    buf.close([g.group_id for g in in_flight])
    assert all(0 <= s <= eta for s in trained_staleness)
    summary = buf.summary()
    assert summary.ok
    assert summary.trained == len(trained_staleness) * 2
    assert len(buf.fate) == next_gid * 2
