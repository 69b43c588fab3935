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
    with pytest.raises(ValueError, match=r"gone\.json: cannot read it \(No such file"):
        Profile.read(tmp_path / "gone.json")


def test_reading_a_profile_imports_no_torch(tmp_path: Path) -> None:
    path = _profile().write(tmp_path / "p.json")
    code = ("import sys; from nobubble.pipeline.runtime.profile_data import Profile; "
            f"Profile.read({str(path)!r}); print('torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
