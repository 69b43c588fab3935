"""``nobubble pp profile | plan | run``: tables, JSON, files, one-line errors."""

from __future__ import annotations

import json

import pytest

from nobubble.cli import main
from nobubble.pipeline.actions import Schedule
from nobubble.trace import read_chrome_trace

TINY = ["--layers", "4", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--vocab", "32"]


def test_profile_plan_run_chain(tmp_path, capsys):
    prof = tmp_path / "profile.json"
    rc = main(["pp", "profile", "--stages", "2", "--no-comm", "--repeats", "1", "-o", str(prof),
               "--json", *TINY])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["blocks"] for s in out["stages"]] == [[0, 1, 2], [3, 4, 5]]
    assert all(s["t_f"] > 0 and s["mem_f"] > 0 for s in out["stages"])

    plan = tmp_path / "plan.csv"
    rc = main(["pp", "plan", "--profile", str(prof), "--ranks", "2", "-m", "4", "-o",
               str(plan), "--json"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    makespans = [s["predicted_step_ms"] for s in out["schedules"]]
    assert makespans == sorted(makespans) and out["best"] == out["schedules"][0]["schedule"]
    best = Schedule.from_csv(plan.read_text())
    assert best.num_ranks == 2 and best.num_microbatches == 4

    trace, png = tmp_path / "run.json", tmp_path / "run.png"
    rc = main(["pp", "run", "--schedule-file", str(plan), "--ranks", "2", "--steps", "2",
               "--no-predict", "--trace", str(trace), "--plot", str(png), "--json", *TINY])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 0 and out["plot"] == str(png)
    assert out["num_steps"] == 2 and len(out["losses"]) == 2 and out["sim_makespan_s"] is None
    events, _ = read_chrome_trace(trace)
    ops = [e for e in events if e.cat != "wait"]
    assert len(ops) == 2 * best.num_actions and {e.rank for e in ops} == {0, 1}


def test_plan_measures_a_builtin_models_blocks_and_weighs_the_exact_solver(tmp_path, capsys):
    """Without --profile, pp plan profiles the model block by block (the planner of --model
    MODULE:FACTORY) and weighs every schedule, the V ones on the 4-stage cut pp run builds."""
    plan = tmp_path / "plan.csv"
    rc = main(["pp", "plan", "--ranks", "2", "-m", "4", "--ilp", "5", "-o", str(plan),
               "--json", *TINY])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["schedule"] for r in out["schedules"]]
    assert {"1f1b", "zb-h1", "zb-v"} <= set(names) and any(n.startswith("ilp-") for n in names)
    assert out["best"] == names[0] and out["recompute"] is False
    best = Schedule.from_csv(plan.read_text())
    assert best.num_ranks == 2 and best.num_microbatches == 4


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0I0\n1F0,1I0,1W0\n")  # 0W0 missing
    assert main(["pp", "run", "--schedule-file", str(bad), "--ranks", "2", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "0" in err and "W" in err
    assert main(["pp", "run", "--schedule-file", str(bad), "--ranks", "3", *TINY]) == 2
    assert "has 2 ranks but --ranks is 3" in capsys.readouterr().err
    assert main(["pp", "run", "-s", "zb-v", "--ranks", "4", *TINY]) == 2
    assert "4 layers but the schedule has 8 stages" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # refused by the argument's type, in argparse
        main(["pp", "plan", "--profile", str(tmp_path / "none.json")])
    assert exc.value.code == 2 and "no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["pp", "profile", "--device", "tpu"], "device='tpu': nobubble runs on cpu or cuda"),
        (["pp", "run", "-s", "1f1b", "--ranks", "2", "--backend", "bogus"], "'bogus' is unknown"),
        (["pp", "plan", "--ranks", "2", "--backend", "gloo", "--device", "meta"], "cpu or cuda"),
        (["pp", "profile", "--threads", "100000"], "--threads 100000 is past this machine's"),
        (["pp", "profile", "--layers", "1000000"], "GiB, past 80% of this machine's"),
        (["pp", "profile", "--arch", "mlp", "--hidden", "20000", "--layers", "40"], "GiB, past"),
        (["pp", "plan", "--profile", "/"], "--profile: / is a folder"),
        (["pp", "run", "-s", "1f1b", "--ranks", "2", "--microbatch-size", "10000000"], "GiB, pa"),
    ],
)
def test_a_device_or_backend_this_machine_lacks_is_refused_before_any_rank(argv, needle, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # an argument's type refuses it inside argparse
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_cuda_is_refused_where_torch_sees_no_gpu(capsys):
    import torch

    if torch.cuda.is_available():  # a GPU machine: more ranks than GPUs
        assert main(["pp", "run", "-s", "1f1b", "--ranks", "999", "--device", "cuda"]) == 2
        assert "999 ranks need 999 GPUs" in capsys.readouterr().err
        return
    assert main(["pp", "profile", "--device", "cuda"]) == 2
    assert "use cpu" in capsys.readouterr().err
    assert main(["pp", "run", "-s", "1f1b", "--ranks", "2", "--backend", "nccl"]) == 2
    assert "nccl" in capsys.readouterr().err


def test_plan_weighs_recompute_and_run_trains_the_same_with_it(tmp_path, capsys):
    """Under a memory limit no plain schedule meets, ``pp plan --recompute`` picks a
    checkpointed one; ``pp run --recompute`` trains to the same losses as without it, with
    fewer activation bytes held on rank 0."""
    prof, plan = tmp_path / "profile.json", tmp_path / "plan.csv"
    assert main(["pp", "profile", "--stages", "2", "--no-comm", "--repeats", "1", "-o",
                 str(prof), *TINY]) == 0  # fmt: skip
    capsys.readouterr()
    args = ["pp", "plan", "--profile", str(prof), "--ranks", "2", "-m", "4", "-o", str(plan)]
    assert main([*args, "--recompute", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["schedules"]
    peak = {(r["schedule"], r["recompute"]): max(r["peak_mib_per_rank"]) for r in rows}
    assert peak[("1f1b", True)] < peak[("1f1b", False)]
    limit = 0.95 * min(v for (_, rec), v in peak.items() if not rec)
    assert main([*args, "--recompute", "--memory-limit-mib", f"{limit}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recompute"] is True and peak[(out["best"], True)] <= limit
    assert main([*args, "--memory-limit-mib", f"{limit}"]) == 2  # without checkpointing
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no candidate fits" in err and "allow recompute" in err

    runs = {}
    for flag in ([], ["--recompute"]):
        rc = main(["pp", "run", "-s", "1f1b", "--ranks", "2", "-m", "4", "--steps", "2",
                   "--no-predict", "--trace", str(tmp_path / "t.json"), "--json", *flag, *TINY])  # fmt: skip
        assert rc == 0
        runs[bool(flag)] = json.loads(capsys.readouterr().out)
    assert runs[True]["losses"] == pytest.approx(runs[False]["losses"], rel=1e-6)
    assert runs[True]["peak_activation_bytes"][0] < runs[False]["peak_activation_bytes"][0]


def test_run_handshake_with_a_straggler(tmp_path, capsys):
    trace = tmp_path / "run.json"
    rc = main(["pp", "run", "-s", "zb-h1", "--ranks", "2", "-m", "4", "--steps", "2",
               "--no-predict", "--dispatch", "handshake", "--straggler", "1:1.5",
               "--trace", str(trace), "--json", *TINY])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_steps"] == 2 and len(out["losses"]) == 2
    events, _ = read_chrome_trace(trace)
    assert len([e for e in events if e.cat != "wait"]) == 2 * 2 * 4 * 3  # steps x ranks x ops


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--straggler", "1:fast"], "FACTOR 'fast' is not a number"),
        (["--straggler", "5:1.5"], "straggler rank 5 is outside ranks 0..1"),
        (["--dispatch", "eager"], "invalid choice: 'eager'"),
    ],
)
def test_bad_dispatch_flags_exit_2_with_one_line(flags, needle, capsys):
    try:  # argparse's own errors leave by SystemExit(2), the checks after parsing return 2
        rc = main(["pp", "run", "-s", "zb-h1", "--ranks", "2", "--no-predict", *flags, *TINY])
    except SystemExit as exit_:
        rc = exit_.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
