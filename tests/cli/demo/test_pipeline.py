"""The pipeline demo step runs and writes its Gantt chart."""

from __future__ import annotations

from nobubble.cli.demo.pipeline import run


def test_demo_writes_png(tmp_path, capsys):
    paths = run(tmp_path, quick=True)
    assert [p.name for p in paths] == ["pipeline_gantt.png"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "ZB-2p over 1F1B" in out and "Rank 3:" in out
