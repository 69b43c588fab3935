"""The load-balancing demo runs, prints, and writes its artifacts."""

from __future__ import annotations

import json

from nobubble.bench.showcase import moe_balance as run


def test_balance_demo_quick(tmp_path, capsys):
    paths = run(tmp_path, quick=True, seed=0)
    assert all(p.exists() for p in paths)
    data = json.loads((tmp_path / "moe" / "eplb_demo.json").read_text())
    assert data["eplb_example_identical"] is True
    assert data["imbalance_after"] < data["imbalance_before"]
    assert data["moved_incremental"] < data["moved_fresh"]
    assert "identical to EPLB: True" in capsys.readouterr().out
