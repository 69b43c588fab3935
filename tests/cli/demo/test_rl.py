"""The RL demo step lists the files its command wrote, not the folder it wrote them into."""

from __future__ import annotations


def test_rl_step_lists_the_files_it_wrote(tmp_path, capsys) -> None:
    from nobubble.cli.demo import run_step

    earlier = tmp_path / "rl" / "train_seed.png"  # the actor-learner step's, from before
    earlier.parent.mkdir()
    earlier.write_bytes(b"x")
    paths = run_step("RL", tmp_path, True, 0)
    names = ["compare.png", "compare_fully-async_trace.json", "compare_one-step-off_trace.json",
             "compare_sync_trace.json"]  # fmt: skip
    assert paths == [tmp_path / "rl" / name for name in names]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"--out {tmp_path}/rl" in capsys.readouterr().out
