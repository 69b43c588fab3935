"""``nobubble ep bench`` end to end (tiny shapes, both transports) and its usage errors; the
demo step."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main


@pytest.mark.parametrize(("transport", "resolved"), [("shm", "shm"), ("dist", "dist")])
def test_ep_bench_json(transport, resolved, capsys):
    ranks, tokens, hidden, topk = 2, 16, 24, 3
    argv = ["ep", "bench", "--ranks", str(ranks), "--tokens", str(tokens), "--hidden", str(hidden)]
    argv += [
        "--experts",
        "8",
        "--topk",
        str(topk),
        "--dtype",
        "bf16",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--transport",
        transport,
    ]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["transport"] == resolved
    assert report["config"]["transport"] == transport
    methods = {m["method"]: m for m in report["methods"]}
    assert set(methods) == {"buffer", "per-pair all-to-all", "all-gather"}
    assert all(m["correct"] for m in methods.values())
    assert methods["buffer"]["verdict"] == "exact, bytes = logical"
    assert methods["per-pair all-to-all"]["verdict"] == "exact"
    # Buffer moves exactly the logical (deduplicated) bytes; per-pair moves one copy per slot
    assert methods["buffer"]["dispatch_payload_bytes"] == report["logical_bytes"]
    assert (
        methods["per-pair all-to-all"]["dispatch_payload_bytes"]
        == ranks * tokens * topk * hidden * 2
    )
    # all-gather: every rank's rows reach every rank; both transports count a gathered row
    # once per receiver (this rank included) and once per other rank as remote
    gathered = ranks * (ranks - 1) * tokens * hidden * 2
    assert methods["all-gather"]["dispatch_remote_bytes"] == gathered
    assert methods["all-gather"]["dispatch_payload_bytes"] == ranks * ranks * tokens * hidden * 2


def test_ep_bench_compares_transports_through_one_buffer(capsys):
    argv = ["ep", "bench", "--ranks", "2", "--tokens", "16", "--hidden", "24", "--experts", "8"]
    argv += ["--topk", "2", "--iters", "1", "--warmup", "0", "--transport", "shm,dist"]
    assert main([*argv, "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)["transports"]
    assert [r["transport"] for r in reports] == ["shm", "dist"]
    for r in reports:  # the same Buffer moves the same logical bytes over either transport
        buffer = r["methods"][0]
        assert buffer["method"] == "buffer" and buffer["correct"]
        assert buffer["dispatch_payload_bytes"] == r["logical_bytes"]
    assert reports[0]["logical_bytes"] == reports[1]["logical_bytes"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Buffer over each transport" in out and "dispatch vs first" in out


def test_ep_bench_table_names_the_run(capsys):
    argv = ["ep", "bench", "--ranks", "2", "--tokens", "16", "--hidden", "24", "--experts", "8"]
    assert main([*argv, "--topk", "2", "--iters", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "ep bench: 2 ranks x 16 tokens x 24 bf16, top-2 of 8 experts" in out
    assert "median of 1" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["ep", "bench", "--ranks", "4", "--experts", "6"], "num_experts=6"),
        (["ep", "bench", "--topk", "9", "--experts", "8", "--ranks", "2"], "topk=9"),
    ],
)
def test_ep_bench_bad_usage(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_ep_bench_bad_dtype_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["ep", "bench", "--dtype", "fp16"])
    assert info.value.code == 2


def test_ep_bench_bad_transport_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["ep", "bench", "--transport", "nvlink"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "nvlink" in err and len(err.splitlines()) == 1


def test_bench_config_rejects_unknown_transport():
    from nobubble.bench.ep_dispatch import BenchConfig

    with pytest.raises(
        ValueError, match="BenchConfig.transport='nvlink' is unknown; choose one of auto, shm, dist"
    ):
        BenchConfig(transport="nvlink")


def test_demo_step(tmp_path):
    from nobubble.bench.showcase import moe as run

    paths = run(tmp_path, quick=True, seed=0)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    summary = json.loads((tmp_path / "moe" / "ep_demo.json").read_text())
    assert summary["buffer_bytes"] < summary["per_pair_bytes"]
    assert summary["imbalance"][-1] < summary["imbalance"][0]


def test_layer_check_imbalance_is_max_over_mean_per_step():
    """Hand-computed: loads (3, 1, 0, 0) are 3x their mean of 1; a step with no tokens is
    balanced (1.0), not a division by zero."""
    from nobubble.bench.ep_layer import LayerCheck

    check = LayerCheck(sent_rows=[], recv_rows=[], buffer_bytes=[], pair_bytes=[],
                       loads=[[3, 1, 0, 0], [2, 2, 2, 2], [0, 0, 0, 0]],
                       max_rel_output_diff=0.0, max_rel_grad_diff=0.0)  # fmt: skip
    assert check.imbalance == [3.0, 1.0, 1.0]
