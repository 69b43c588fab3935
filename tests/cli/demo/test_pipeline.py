"""The pipeline demo steps run and write their charts."""

from __future__ import annotations


def test_demo_writes_png(tmp_path, capsys):
    from nobubble.cli.demo import run_step

    paths = run_step("pipeline schedules", tmp_path, True, 0)
    assert [p.name for p in paths] == ["pipeline_gantt.png"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "ZB-2p over 1F1B" in out and "Rank 3:" in out
    # --quick takes the QUICK side of the step's "--no-torch|" word
    assert f"--plot {tmp_path}/pipeline_gantt.png --no-torch\n" in out


def test_handshake_step_draws_static_and_handshake_under_a_straggler(tmp_path, capsys) -> None:
    from nobubble.cli.demo import run_step

    pngs = run_step("pipeline handshake", tmp_path, True, 0)
    names = ["handshake_static_p8_m24.png", "handshake_handshake_p8_m24.png"]
    assert [p.name for p in pngs] == names
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    out = capsys.readouterr().out
    static, handshake = (
        float(x.split()[2].rstrip("%")) for x in out.splitlines() if x.startswith("bubble rate")
    )
    assert handshake <= static  # the straggler's waits are filled


def test_replan_step_moves_layers_off_the_slow_rank_and_draws_it(tmp_path, capsys) -> None:
    from nobubble.bench.showcase import replan as run
    from nobubble.cli.demo import STEPS

    assert "pipeline re-planning" in dict(STEPS)
    (png,) = run(tmp_path, quick=True, seed=0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "yes" in out  # a re-plan happened
    assert "(6, 7)" in out  # the even cut first: six blocks, then six and the head
    last = [line for line in out.splitlines() if line.strip().startswith(("│ 7", "| 7"))]
    assert last and "(6, 7)" not in last[0], out  # rank 1 holds fewer layers at the end


def test_plan_step_plans_torch_modules_and_shows_the_naive_plan(tmp_path, capsys) -> None:
    from nobubble.cli.demo import run_step
    from nobubble.pipeline.plan import Plan

    plan, png = run_step("pipeline planning", tmp_path, True, 0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = Plan.from_json(plan.read_text())
    assert p.num_blocks == 6 and p.num_ranks == 2
    out = capsys.readouterr().out
    assert "pp plan --model nobubble.bench.showcase:plan_model" in out
    assert "chosen" in out and "naive" in out
