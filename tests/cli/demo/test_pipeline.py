"""The pipeline demo step runs and writes its Gantt chart."""

from __future__ import annotations

from nobubble.cli.demo.pipeline import run


def test_demo_writes_png(tmp_path, capsys):
    paths = run(tmp_path, quick=True)
    assert [p.name for p in paths] == ["pipeline_gantt.png"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "ZB-2p over 1F1B" in out and "Rank 3:" in out


def test_handshake_step_draws_static_and_handshake_under_a_straggler(tmp_path, capsys) -> None:
    from nobubble.cli.demo import _handshake_step, steps

    assert "pipeline handshake" in [name for name, _ in steps()]
    (png,) = _handshake_step(tmp_path, True, 0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = [x.split() for x in capsys.readouterr().out.splitlines() if "bubble" in x]
    bubbles = {parts[0]: float(parts[2].rstrip("%")) for parts in lines}
    assert set(bubbles) == {"static", "handshake"}
    assert bubbles["handshake"] <= bubbles["static"]  # the straggler's waits are filled
