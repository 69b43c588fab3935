"""The MoE fast-path demo step end to end (quick shapes): every check it makes holds and it
writes its summary and picture."""

from __future__ import annotations

import json

from nobubble.bench.showcase import moe_fastpath as run


def test_fastpath_demo_step(tmp_path):
    paths = run(tmp_path, quick=True, seed=0)
    assert [p.name for p in paths] == ["fastpaths.json", "ep_overlap_timeline.png"]
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    s = json.loads(paths[0].read_text())
    assert s["transports"]["bit_equal"] is True
    assert set(s["transports"]["rows"]) == {"gloo", "shm-unfused", "shm-fused-torch", "shm"}
    hier = s["hierarchical"]
    assert hier["formula_holds"] and hier["bit_equal_dispatch"]
    assert hier["inter_node_bytes_hierarchical"] < hier["inter_node_bytes_flat"]
    assert 0.5 < s["low_latency"]["fp8_over_bf16_bytes"] < 0.55  # (H + 4 H/128) / 2H
    for transport in ("gloo", "shm"):
        rows = s["overlap"]["rows"][transport]
        assert set(rows) == {"no overlap", "chunked sequential", "chunked overlap"}
        assert rows["no overlap"]["communication_hidden"] == 0.0


def test_fastpath_problems_names_each_broken_check():
    from nobubble.bench.ep_fastpath import fastpath_problems

    good = {
        "transports": {"bit_equal": True},
        "hierarchical": {"bit_equal_dispatch": True, "formula_holds": True},
        "low_latency": {"fp8_over_bf16_bytes": 0.52},
    }
    assert fastpath_problems(good) == [] and fastpath_problems({}) == []
    bad = {
        "transports": {"bit_equal": False},
        "hierarchical": {"bit_equal_dispatch": True, "formula_holds": False},
        "low_latency": {"fp8_over_bf16_bytes": 1.0},
    }
    assert fastpath_problems(bad) == [
        "shared-memory results differ from gloo's",
        "hierarchical bytes != distinct (token, node) pairs x H x 2",
        "FP8 does not halve the bytes",
    ]
