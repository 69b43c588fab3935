"""A profile's JSON file (:class:`~nobubble.pipeline.runtime.profile_data.Profile`): what
``write`` puts down ``read`` gives back, and ``read`` refuses, naming the file, whatever is no
profile - without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nobubble.pipeline.runtime.profile_data import Profile, StageProfile


def _profile() -> Profile:
    stages = tuple(
        StageProfile(stage=s, blocks=(2 * s, 2 * s + 1), t_f=1.5 + s, t_b=1.25, t_w=0.5,
                     t_bw_fused=1.5, mem_f=4096, mem_w=1024, bw_ratio=1.25, out_bytes=512)
        for s in range(2)
    )  # fmt: skip
    return Profile(model="gpt", microbatch_size=2, stages=stages, t_comm=0.25,
                   activation_bytes=512, clock="cpu")  # fmt: skip


def test_what_write_puts_down_read_gives_back(tmp_path: Path) -> None:
    prof = _profile()
    path = prof.write(tmp_path / "profile.json")
    assert Profile.read(path) == prof
    on_disk = json.loads(path.read_text())  # the file a person reads: derived columns too
    assert on_disk["stages"][1]["t_f"] == 2.5 and on_disk["stages"][0]["mem_b"] == 3072


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "not a pp profile JSON (Expecting value"),
        ("[1, 2]", "not a pp profile JSON (TypeError"),
        ('{"model": "gpt"}', "not a pp profile JSON (KeyError"),
        ("[" * 100_000, "not a pp profile JSON"),
    ],
)
def test_a_file_that_is_no_profile_is_refused_naming_it(tmp_path: Path, text, needle) -> None:
    path = tmp_path / "odd.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"^" + str(path) + ": ") as err:
        Profile.read(path)
    assert needle in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("t_f", 1e308), ("out_bytes", 1e300), ("t_w", -1.0)])
def test_a_cost_out_of_range_is_refused(tmp_path: Path, key: str, value: float) -> None:
    data = _profile().to_dict()
    data["stages"][1][key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    needle = f"stage 1 {key}={value!r} must be finite" if value > 0 else "t_w[1]=-1.0 must be"
    with pytest.raises(ValueError, match=r"^" + str(path)) as err:
        Profile.read(path)
    assert needle in str(err.value)


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"gone\.json: no such file; write one with pp profile -o"):
        Profile.read(tmp_path / "gone.json")


def test_reading_a_profile_imports_no_torch(tmp_path: Path) -> None:
    path = _profile().write(tmp_path / "p.json")
    code = ("import sys; from nobubble.pipeline.runtime.profile_data import Profile; "
            f"Profile.read({str(path)!r}); print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_runs_prediction_is_its_schedule_at_the_profiles_costs() -> None:
    """:func:`~nobubble.pipeline.runtime.report.simulate_run`: the config's schedule at the
    profile's per-stage times, B and BW a forward longer under recompute."""
    from nobubble.pipeline.runtime.executor import TrainConfig
    from nobubble.pipeline.runtime.models import MLPConfig
    from nobubble.pipeline.runtime.report import simulate_run
    from nobubble.pipeline.schedules import get_schedule

    sched = get_schedule("gpipe", num_ranks=2, num_microbatches=3)
    plain = TrainConfig(model=MLPConfig(num_layers=2), schedule=sched)
    prof = _profile()  # t_f 1.5 and 2.5 ms, fused backward 1.5 ms, t_comm 0.25 ms
    # gpipe by hand: forwards end at 1.5 + 0.25 + 3 x 2.5 = 9.25 ms on rank 1, which then
    # runs 3 fused backwards (1.5 each) and hands the last one back: + 0.25 + 1.5 on rank 0
    assert simulate_run(plain, prof).makespan == pytest.approx(9.25 + 3 * 1.5 + 0.25 + 1.5)
    again = TrainConfig(model=MLPConfig(num_layers=2), schedule=sched, recompute=True)
    longer = 9.25 + 3 * (2.5 + 1.5) + 0.25 + (1.5 + 1.5)  # each backward runs F once more
    assert simulate_run(again, prof).makespan == pytest.approx(longer)
