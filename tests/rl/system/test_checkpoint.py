"""Checkpoint / resume: SIGKILL a run at random points, resume it, and compare it with a run
that was never interrupted (the independent reference): same sample fates, same weights.

Sync mode with one generator is deterministic, so the resumed run must reproduce the
uninterrupted one exactly: every sample trained at the same step, bit-identical weights and
loss terms at every step (seen through the public API: the final checkpoints loaded into a
learner, and each resumed for one more step).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nobubble.rl.system.checkpoint import (
    LAYOUT,
    STATE_FILE,
    TRAINER_FILE,
    CheckpointStore,
    load_trainer,
)
from nobubble.rl.system.config import ReplayConfig, RunConfig
from nobubble.rl.system.learner import Learner, group_learner
from nobubble.rl.system.orchestrator import run

pytestmark = pytest.mark.timeout(600)

STEPS = 60
KILLS = 4
RUN = [
    "rl", "train", "--mode", "sync", "--steps", str(STEPS), "--batch-groups", "2",
    "--group-size", "4", "--eval-every", "20", "--policy-kwargs", '{"hidden": 16}',
    "--checkpoint-every", "1", "--json",
]  # fmt: skip


def _cmd(ckpt: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nobubble",
        *RUN,
        "--checkpoint-dir",
        str(ckpt),
        "--out",
        str(out),
    ]


def _resumed(ckpt: Path) -> RunConfig:
    """``RUN``'s config, resumed from ``ckpt`` for one more step."""
    return RunConfig(mode="sync", steps=STEPS + 1, batch_groups=2, group_size=4, eval_every=20,
                     policy_kwargs={"hidden": 16}, checkpoint_dir=str(ckpt), resume=True)  # fmt: skip


def _final_learner(ckpt: Path) -> Learner:
    """A learner loaded from the last checkpoint in ``ckpt`` as a resumed trainer loads it."""
    cfg = _resumed(ckpt)
    task = cfg.make_task()
    learner = group_learner(task=task, model=cfg.build_policy(task), cfg=cfg)
    last = CheckpointStore(ckpt).latest()
    assert last is not None
    load_trainer(last, learner)
    return learner


def _step(ckpt: Path) -> int:
    pointer = ckpt / "latest"
    return int(pointer.read_text().split("-")[1]) if pointer.is_file() else 0


@pytest.mark.long  # the fault matrix: kills at random moments of a real run
def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(tmp_path):
    ref_dir, out = tmp_path / "ref", tmp_path / "out"
    subprocess.run(_cmd(ref_dir, out), check=True, capture_output=True, timeout=300)

    ckpt = tmp_path / "killed"
    rng = random.Random(0)
    kills, steps_at_kill = 0, []
    while True:
        proc = subprocess.Popen(
            [*_cmd(ckpt, out), *(["--resume-or-start"] if kills else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: the kill takes the workers too
        )
        if kills < KILLS:
            if kills == 0:
                time.sleep(rng.uniform(0.5, 3.0))  # during start-up
            else:  # after a few more checkpoints: mid-step, mid-checkpoint, mid-eval, ...
                goal, deadline = _step(ckpt) + rng.randint(1, 8), time.monotonic() + 120
                while _step(ckpt) < goal and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.1))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                kills += 1
                steps_at_kill.append(_step(ckpt))
                continue
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr.decode()[-2000:]
        break
    assert kills == KILLS and steps_at_kill[-1] < STEPS, steps_at_kill
    result = json.loads(stdout)
    assert result["details"]["resumed_from"] is not None and result["steps"] == STEPS
    assert result["ledger"]["ok"]

    trainer, ref_trainer = _final_learner(ckpt), _final_learner(ref_dir)
    assert trainer.version == ref_trainer.version == STEPS
    for name, want in ref_trainer.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], want), name
    # one more step from each final checkpoint: the public view of all else it holds
    got, ref = run(_resumed(ckpt)), run(_resumed(ref_dir))
    assert got.steps == ref.steps == STEPS + 1
    assert got.fates == ref.fates  # the same samples, each trained once, at the same step
    trained = [f for f in got.fates.values() if f.startswith("trained@")]
    assert len(trained) == len(got.fates) == (STEPS + 1) * 2 * 4
    # every step's loss terms exact: the killed run trained on the same weights throughout
    assert len(got.step_metrics) == STEPS + 1
    assert got.step_metrics == ref.step_metrics


TINY = dict(batch_groups=2, group_size=4, eval_every=5, policy_kwargs={"hidden": 16}, timeout_s=240)


def test_async_resume_requeues_groups_in_flight_and_loses_none(tmp_path):
    """A fully-async checkpoint has groups in flight: the resumed run generates them again
    under the same ids, and every sample still gets exactly one fate."""
    cfg = RunConfig(
        mode="fully-async", steps=6, checkpoint_dir=str(tmp_path), checkpoint_every=3, **TINY
    )
    first = run(cfg)
    assert first.ledger.ok
    with pytest.raises(ValueError, match="--resume"):
        run(cfg)  # refuses to overwrite the checkpoint before any worker starts
    # the groups in flight as the checkpoint lists them: the list resume acts on
    state = torch.load(CheckpointStore(tmp_path).latest() / STATE_FILE, weights_only=False)
    assert state["layout"] == LAYOUT
    resumed = run(RunConfig(**{**cfg.__dict__, "steps": 10, "resume": True}))
    assert resumed.ledger.ok and resumed.steps == 10
    in_flight = {r.group_id for r in state["in_flight"]}
    assert {g for g, why in resumed.requeues if why == "resumed"} == in_flight
    # the last checkpoint is the run's end (step 6): what the run settled stays settled
    settled = {s: f for s, f in first.fates.items() if f != "dropped:unfinished"}
    assert settled and {s: resumed.fates[s] for s in settled} == settled


def test_resume_refuses_a_changed_config(tmp_path):
    cfg = RunConfig(mode="sync", steps=2, checkpoint_dir=str(tmp_path), **TINY)
    run(cfg)
    with pytest.raises(ValueError, match="seed"):
        run(RunConfig(**{**cfg.__dict__, "seed": 1, "resume": True}))
    # the replay's buffer is restored from the checkpoint: a new replay setting cannot act
    replay = ReplayConfig(mode="uniform", capacity=4, groups_per_step=1)
    with pytest.raises(ValueError, match="config changed.*replay"):
        run(RunConfig(**{**cfg.__dict__, "replay": replay, "resume": True}))


def test_a_checkpoint_written_before_layouts_were_numbered_still_resumes(tmp_path):
    """The nobubble just before layout numbers wrote layout 1's content without the number:
    its checkpoint resumes (nothing of the run is lost)."""
    cfg = RunConfig(mode="sync", steps=2, checkpoint_dir=str(tmp_path), **TINY)
    run(cfg)
    ckpt = CheckpointStore(tmp_path).latest()
    assert ckpt is not None
    for name in (STATE_FILE, TRAINER_FILE):  # as that nobubble wrote them
        state = torch.load(ckpt / name, weights_only=False)
        del state["layout"]
        torch.save(state, ckpt / name)
    resumed = run(RunConfig(**{**cfg.__dict__, "steps": 4, "resume": True}))
    assert resumed.steps == 4 and resumed.ledger.ok


def test_pruning_keeps_the_checkpoint_being_written_and_removes_leftovers(tmp_path):
    """With trainer prefetch, step N+1's folder exists (the trainer writes into it) when
    step N commits: pruning must keep it, and remove what a killed run left half-written."""
    store = CheckpointStore(tmp_path, keep=1)
    leftover = tmp_path / "step-000003-dead00"
    leftover.mkdir()
    for step in (1, 2):
        ckpt = store.new_dir(step)
        (ckpt / TRAINER_FILE).write_bytes(b"x")
        nxt = store.new_dir(step + 1)  # prefetched: being written, no state yet
        store.commit(ckpt, {"step": step})
        assert nxt.is_dir() and ckpt.is_dir()
    assert not leftover.exists()
    latest = store.latest()
    assert latest is not None and latest.name.startswith("step-000002-")
    assert not list(tmp_path.glob("step-000001-*"))  # keep=1


OTHER_LAYOUTS = {
    # field by field, before RunProgress was saved as one object (597f3ab and older)
    "fields": {"version": 2, "next_group": 4, "published": {}, "wall_s": 1.0},
    # RunProgress beside the prompt RNG, the digests and the replay (61be5c0 and older)
    "beside": {"progress": None, "published": {}, "rng": None, "replay": None, "wall_s": 1.0},
    # the buffer's state with a Ledger object in it (before the ledger joined the buffer)
    "ledger": {"progress": None, "buffer": {"num_live": 0, "ready": [], "ledger": None}},
    # a number this nobubble does not know
    "unknown": {"layout": LAYOUT + 1, "progress": None, "buffer": {}, "in_flight": []},
}


@pytest.mark.parametrize("layout", sorted(OTHER_LAYOUTS))
def test_a_checkpoint_of_another_layout_is_refused_naming_it_and_the_fix(tmp_path, layout):
    """A checkpoint file without this nobubble's layout number is refused in one line that
    names the number, not half-loaded: the driver's state on resume and the trainer's."""
    cfg = RunConfig(mode="sync", steps=2, checkpoint_dir=str(tmp_path), **TINY)
    store = CheckpointStore(tmp_path)
    ckpt = store.new_dir(2)
    (ckpt / TRAINER_FILE).write_bytes(b"x")
    store.commit(ckpt, {})
    old = {"config": cfg.to_dict(), **OTHER_LAYOUTS[layout]}
    for name in (STATE_FILE, TRAINER_FILE):  # as an older (or newer) nobubble wrote them
        torch.save(old, ckpt / name)
    cfg = RunConfig(**{**cfg.__dict__, "resume": True})  # resume needs the checkpoint there
    found = old.get("layout")
    has = "no checkpoint layout" if found is None else f"checkpoint layout {found}"
    who = "an older" if found is None else "another"
    refusal = (rf"^{ckpt} was written by {who} nobubble \({has}; this one reads layout "
               rf"{LAYOUT}\); start a new run in an empty checkpoint folder$")  # fmt: skip
    with pytest.raises(ValueError, match=refusal):
        store.resume(cfg)
    with pytest.raises(ValueError, match=refusal):
        load_trainer(ckpt, learner=None)  # refused before it touches the learner
