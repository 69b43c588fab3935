"""A hostile user's sweep of ``pp``, ``trace`` and ``demo`` (issue 38): every case below must
be refused before any work - exit status 2, exactly one line on stderr that contains the
case's needle, nothing on stdout.

``CASES`` maps each sub-command to its hostile inputs: huge, zero and negative sizes, NaN,
inf and 1e308, words where numbers go, contradictory or ignored flags, outputs that cannot be
written (``/proc``, a folder, a special file, a path under a regular file), special and
malformed input files, plot files of a format matplotlib does not write, unknown names.
``{name}`` in an argument is one of the files :func:`hostile_files` writes. The fast tier
runs every case in this process (``nobubble.cli.main``); the long tier runs a few through a
real ``python -m nobubble`` and times them (< 2 s), checking that nothing is left behind.

``VALID`` lists inputs that look hostile but are accepted on purpose, each with its reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nobubble.cli import main

# -- the sweep ------------------------------------------------------------------------------
# the pipeline's size, shared by every command that takes --ranks/--microbatches
SIZES = [
    ("-p 0", "0 must be > 0"),
    ("-p -3", "-3 must be > 0"),
    ("-m 0", "0 must be > 0"),
    ("-m nan", "'nan' is not an integer"),
    ("-p inf", "'inf' is not an integer"),
    ("-p 1e308", "'1e308' is not an integer"),
    ("-m four", "'four' is not an integer"),
    ("-p 1000000000 -m 1", "--force"),
    ("-p 2 -m 1000000000", "--force"),
    ("-p 100000 -m 100000", "--force"),
]
# per-rank costs and memory, shared by every command that simulates
COSTS = [
    ("--tf nan", "'nan' is not a finite number"),
    ("--tb 1e308", "'1e308' is not a finite number"),
    ("--tw inf", "'inf' is not a finite number"),
    ("--mem-f 1e308", "'1e308' is not a finite number"),
    ("--tcomm 1e308", "'1e308' is not a finite number"),
    ("--tf -1", "-1 must be > 0"),
    ("--tf 0", "0 must be > 0"),
    ("--tf 1,2,3", "3 entries"),
    ("--hidden 64", "hidden, heads and seq go together; give all three (hidden=64"),
    ("--mem-f 2 --hidden 64 --heads 4 --seq 8", "not both"),
    ("--mem-b 1", "mem_b=1.0/mem_w=None need mem_f"),
    ("--mem-f 1 --mem-b 1 --mem-w 1", "mem_b + mem_w = 2 on rank 0 frees more than mem_f = 1"),
    ("--model 99B", "invalid choice: '99B'"),
    ("--hidden 1000000000 --heads 1000000000 --seq 1000000000", "must be finite"),
]
# a figure file nobody can write, shared by every --plot
PLOTS = [
    ("--plot x.txt", "a figure is written as .png, .svg, .pdf"),
    ("--plot /proc/x.png", "cannot create files in /proc"),
    ("--plot {dir}", "is a folder"),
    ("--plot {file}/x.png", "is a file, not a folder"),
]
BIG_MODEL = [  # the built-in model's size: refused by the memory or time budget
    ("--layers 1000000", "--force"),
    ("--hidden 1000000", "--force"),
    ("--microbatch-size 10000000", "--force"),
    ("--vocab 1000000000", "--force"),
    ("--threads 100000", "--threads 100000 is past this machine's"),
    ("--heads 3", "hidden=64 is not divisible by num_heads=3; give hidden a multiple"),
    ("--seed 100000000000000000000000000000", "--seed"),
]
LAUNCH = [  # a device or backend this machine or torch build does not have
    ("--device tpu", "'tpu'"),
    ("--device cuda", "'cuda'"),
    ("--backend nccl", "'nccl'"),
    ("--backend bogus", "'bogus' is unknown"),
    ("--timeout nan", "'nan' is not a finite number"),
    ("--timeout 0", "--timeout 0.0: timeout_s=0.0 must be > 0"),  # LaunchOptions, not spawn
]
SCHEDULE_FILES = [  # a schedule CSV that is no schedule
    ("{dir}", "is a folder"),
    ("/dev/null", "not a regular file"),
    ("{missing}", "no such file"),
    ("{empty}", "CSV holds no actions"),
    ("{garbage}", "CSV line 1"),
    ("{binary}", "not UTF-8 text"),
    ("{bigmb}", "microbatch"),
]
TRACE_FILES = [  # a trace file that is no trace
    ("{dir}", "is a folder"),
    ("/dev/null", "not a regular file"),
    ("{missing}", "no such file"),
    ("{empty}", "not JSON"),
    ("{garbage}", "not JSON"),
    ("{binary}", "not UTF-8 text"),
    ("{trace_huge}", "1e+308 is not a finite number"),
    ("{trace_nan}", "start_us=nan is not finite"),
    ("{trace_neg}", "negative duration"),
    ("{trace_lacks}", "lacks ts"),
    ("{trace_scalar}", "expected a list of events"),
    ("{trace_strts}", "event 0"),
    ("{trace_deep}", "nested too deeply"),
]


def _with(prefix: str, cases: list[tuple[str, str]], suffix: str = "") -> list[tuple[str, str]]:
    return [(f"{prefix} {args} {suffix}".strip(), needle) for args, needle in cases]


CASES: dict[str, list[tuple[str, str]]] = {
    "pp show": _with("pp show", SIZES)
    + _with(
        "pp show",
        [
            ("-s bogus", "unknown schedule 'bogus'"),
            ("-v 0", "0 must be > 0"),
            ("-s interleaved-1f1b -v 1000000000", "--force"),
            ("-s zb-v -v 3", "zb-v always has 2 chunks per rank, not 3"),
            ("--csv {csv} -s zb-v", "--csv {csv} sets the schedule"),
            ("--csv {csv} -p 8", "--csv {csv} sets the schedule"),
            ("--csv {csv} -m 3", "--csv {csv} sets the schedule"),
            ("--csv {csv} -v 2", "--csv {csv} sets the schedule"),
        ],
    )
    + _with("pp show --csv", SCHEDULE_FILES),
    "pp simulate": _with("pp simulate", SIZES + COSTS + PLOTS)
    + _with(
        "pp simulate",
        [
            ("--straggler 1:1e308", "FACTOR 1e308 must be finite"),
            ("--straggler 9:2", "rank 9 is outside ranks 0..3"),
            ("--straggler x", "expected RANK:FACTOR"),
            ("--jitter 1", "jitter=1.0 must be >= 0 and < 1"),
            ("--jitter nan", "'nan' is not a finite number"),
            ("--seed -1", "-1 must be >= 0"),
            ("--dispatch bogus", "invalid choice: 'bogus'"),
            ("--trace /dev/null", "not a regular file"),
            ("--trace /proc/x.json", "cannot create files in /proc"),
            ("-s zb-1p --mem-limit 0.5", "--mem-limit 0.5 is below one microbatch"),
            ("-s 1f1b --mem-limit 4", "mem_limit applies to zb-1p / zb-2p, not '1f1b'"),
            ("--dispatch handshake --mem-limit 1", "is below zb-h1's peak"),
            ("-s bogus", "unknown schedule 'bogus'"),
            ("--seed 5", "--seed 5 seeds the --jitter draws"),
        ],
    ),
    "pp compare": _with("pp compare", SIZES + COSTS + PLOTS)
    + _with(
        "pp compare",
        [
            ("--ilp 0", "0 must be > 0"),
            ("--ilp nan", "'nan' is not a finite number"),
            ("--mem-limit 0.5", "--mem-limit 0.5 is below one microbatch"),
            ("-v 0", "0 must be > 0"),
            ("-s 1f1b", "unrecognized arguments: -s 1f1b"),
        ],
    ),
    "pp export": _with("pp export", SIZES + COSTS)
    + _with(
        "pp export",
        [
            ("-o /proc/x.csv", "cannot create files in /proc"),
            ("-o {dir}", "is a folder"),
            ("-o /dev/null", "not a regular file"),
            ("-o {file}/x.csv", "is a file, not a folder"),
            ("-s bogus", "unknown schedule 'bogus'"),
            ("-s 1f1b --mem-limit 4", "mem_limit applies to zb-1p / zb-2p, not '1f1b'"),
        ],
    ),
    "pp validate": _with("pp validate", SCHEDULE_FILES)
    + _with(
        "pp validate {csv}",
        [
            ("--tf nan", "'nan' is not a finite number"),
            ("--tb 1e308", "'1e308' is not a finite number"),
            ("--mem-f 1e308", "'1e308' is not a finite number"),
            ("--tcomm inf", "'inf' is not a finite number"),
            ("--tf 1,2,3", "3 entries"),
            ("--hidden 64", "hidden, heads and seq go together; give all three (hidden=64"),
            ("--mem-b 1", "mem_b=1.0/mem_w=None need mem_f"),
            ("--model 99B", "invalid choice: '99B'"),
            ("--mem-limit 4", "--mem-limit"),
            ("{csv}", "unrecognized arguments"),
        ],
    )
    + _with("pp validate", [("{badorder}", "schedule deadlocks")]),
    "pp solve": _with("pp solve", SIZES + COSTS + PLOTS)
    + _with(
        "pp solve",
        [
            ("--time-limit 0", "0 must be > 0"),
            ("--time-limit nan", "'nan' is not a finite number"),
            ("--workers 0", "0 must be > 0"),
            ("--workers 100000", "--workers 100000 is past this machine's"),
            ("--placement v", "--placement v needs --chunks 2"),
            ("--objective bogus", "invalid choice: 'bogus'"),
            ("--csv /proc/x.csv", "cannot create files in /proc"),
            ("--csv {dir}", "is a folder"),
            ("--mem-limit nan", "'nan' is not a finite number"),
            ("-v 1000000000", "--force"),
        ],
    ),
    "pp frontier": _with("pp frontier", [(a, n) for a, n in SIZES if a != "-p 0"] + COSTS)
    + _with(
        "pp frontier",
        [
            ("-p 1", "--ranks 1: a frontier needs at least 2 ranks"),
            ("--mem-limit 4", "not --mem-limit"),
            ("--mem-limits 0.5", "--mem-limits 0.5 is below one microbatch"),
            ("--mem-limits a,b", "'a' is not a number"),
            ("--mem-limits 2,nan", "'nan' is not a finite number"),
            ("--ilp 0", "0 must be > 0"),
            ("--ilp nan", "'nan' is not a finite number"),
            ("--costs {dir}", "is a folder"),
            ("--costs /dev/null", "not a regular file"),
            ("--costs {empty}", "not a pp profile JSON"),
            ("--costs {garbage}", "not a pp profile JSON"),
            ("--costs {profile} --model 1.5B", "--costs replaces --model"),
            ("--costs {profile} --tcomm 1", "--costs replaces --tcomm"),
            ("--costs {profile_huge} -p 2", "must be finite"),
            ("--plot x.txt", "a figure is written as .png, .svg, .pdf"),
            ("--plot /proc/x.png", "cannot create files in /proc"),
        ],
    ),
    "pp profile": _with("pp profile", BIG_MODEL + LAUNCH)
    + _with(
        "pp profile",
        [
            ("--repeats 1000000000", "--repeats 1000000000"),
            ("--repeats 0", "0 must be > 0"),
            ("--stages 0", "0 must be > 0"),
            ("--stages 100", "100"),
            ("--model {userpy}:factory", "pp profile takes the built-in models"),
            ("--arch bogus", "invalid choice: 'bogus'"),
            ("--clock bogus", "invalid choice: 'bogus'"),
            ("-o /proc/x.json", "cannot create files in /proc"),
            ("-o {dir}", "is a folder"),
            ("-o {locked}", "being written by another live run"),
            ("--timeout 1e308", "'1e308' is not a finite number"),
        ],
    ),
    "pp plan": _with("pp plan", BIG_MODEL + LAUNCH)
    + _with(
        "pp plan",
        [
            ("--profile {dir}", "is a folder"),
            ("--profile /dev/null", "not a regular file"),
            ("--profile {missing}", "no such file"),
            ("--profile {garbage}", "not a pp profile JSON"),
            ("--profile {empty}", "not a pp profile JSON"),
            ("--profile {profile} --layers 8", "--profile {profile} sets the model"),
            ("--profile {profile} --arch mlp", "--profile {profile} sets the model"),
            ("--profile {profile_huge}", "must be finite"),
            ("--profile {profile} -p 4", "the profile has 2 stages but num_ranks is 4"),
            ("--plot x.png", "--plot applies to --model MODULE:FACTORY"),
            ("--overhead-ms 5", "--overhead-ms applies to --model MODULE:FACTORY"),
            ("--overhead-ms 1e308", "'1e308' is not a finite number"),
            ("--ilp nan", "'nan' is not a finite number"),
            ("--memory-limit-mib 0", "0 must be > 0"),
            ("-o /proc/x.csv", "cannot create files in /proc"),
            ("-o {dir}", "is a folder"),
            ("-o {locked}", "being written by another live run"),
            ("-m 0", "0 must be > 0"),
            ("-p 100000", "--force"),
            ("-m 1000000000", "--force"),
            ("--model nosuch_module_xyz:factory", "nosuch_module_xyz"),
            ("--model {broken}:factory", "SyntaxError"),
            ("--model {userpy}:factory --profile {profile}", "--profile applies to the built-in"),
            ("--model {userpy}:factory --layers 8", "--layers: the built-in models' flags"),
        ],
    ),
    "pp run": _with("pp run -s 1f1b -p 2", BIG_MODEL + LAUNCH)
    + _with(
        "pp run",
        [
            ("-s 1f1b -p 2 --steps 1000000000", "--steps 1000000000"),
            ("-s 1f1b -p 2 --steps 0", "0 must be > 0"),
            ("-s 1f1b -p 2 -m 1000000000", "--force"),
            ("-s 1f1b -p 64", "64 processes"),
            ("-s 1f1b -p 2 --lr 1e308", "'1e308' is not a finite number"),
            ("-s 1f1b -p 2 --lr nan", "'nan' is not a finite number"),
            ("-s 1f1b -p 2 --lr inf", "'inf' is not a finite number"),
            ("--schedule-file {csv} -p 2 -m 8", "{csv} runs 4 microbatches"),
            ("--schedule-file {csv} -p 3", "has 2 ranks but --ranks is 3"),
            ("--schedule-file {dir} -p 2", "is a folder"),
            ("--schedule-file /dev/null -p 2", "not a regular file"),
            ("--schedule-file {garbage} -p 2", "CSV line 1"),
            ("-s 1f1b -p 2 --plot x.txt", "a figure is written as .png, .svg, .pdf"),
            ("-s 1f1b -p 2 --trace {dir}", "is a folder"),
            ("-s 1f1b -p 2 --trace /proc/x.json", "cannot create files in /proc"),
            ("-s 1f1b -p 2 --trace {locked}", "being written by another live run"),
            ("-s bogus -p 2", "unknown schedule 'bogus'"),
            ("-s 1f1b", "--ranks is required"),
            ("-s 1f1b -p 2 --straggler 1:1e308", "FACTOR 1e308 must be finite"),
            ("-s 1f1b -p 2 --straggler 5:2", "5"),
            ("--plan {garbage} --model {userpy}:factory", "not a plan JSON"),
            ("--plan {garbage} --model {userpy}:factory --arch mlp", "--arch: the built-in"),
            ("--model {userpy}:factory -s 1f1b -p 2", "--model MODULE:FACTORY runs a plan"),
            ("-s 1f1b -p 2 --optimizer bogus", "invalid choice: 'bogus'"),
            ("-s 1f1b -p 2 --arch mlp --heads 4", "--heads: not a setting of MLPConfig"),
            ("-s 1f1b -p 2 --dispatch bogus", "invalid choice: 'bogus'"),
            ("-s 1f1b --schedule-file {csv} -p 2", "not allowed with argument"),
        ],
    ),
    "trace merge": _with("trace merge", TRACE_FILES, "-o {out}")
    + _with(
        "trace merge {trace}",
        [
            ("-o {dir}", "is a folder"),
            ("-o /proc/x.json", "cannot create files in /proc"),
            ("-o /dev/null", "not a regular file"),
            ("-o {file}/x.json", "is a file, not a folder"),
            ("", "the following arguments are required: -o/--output"),
            ("{trace_bigdur} -o {out}", "dur_us=1e+20 is not a finite"),
        ],
    ),
    "trace summary": _with("trace summary", TRACE_FILES)
    + _with(
        "trace summary",
        [
            ("{trace} {dir}", "is a folder"),
            ("{trace_inf}", "dur_us=inf is not a finite number"),
            ("{trace_events5}", "expected a list of events"),
            ("{trace_bigdur}", "dur_us=1e+20 is not a finite number"),
            ("{trace_pidstr}", "event 0"),
            ("", "the following arguments are required: files"),
        ],
    ),
    "demo": _with(
        "demo",
        [
            ("--out /proc/x", "cannot create files in /proc"),
            ("--out {file}", "is a file"),
            ("--out /dev/null", "is a file"),
            ("--out {file}/sub", "is a file, not a folder"),
            ("--only bogus", "unknown step(s) ['bogus']"),
            ("--only ,", "--only ',' names no step"),
            ("--only merge,,bogus", "unknown step(s) ['bogus']"),
            ("--seed -1", "-1 must be >= 0"),
            ("--seed nan", "'nan' is not an integer"),
            ("--seed 1e308", "'1e308' is not an integer"),
            ("--seed abc", "'abc' is not an integer"),
            ("--seed 100000000000000000000000000000", "--seed"),
            ("--quick extra", "unrecognized arguments: extra"),
            ("--bogus-flag", "unrecognized arguments: --bogus-flag"),
            ("--only merge --out /proc/x", "cannot create files in /proc"),
        ],
    ),
}

VALID = {
    # argv: why it is accepted
    "pp export -o {missing_dir}/x.csv": "a missing folder is created (files.check_output_file: "
    "the nearest existing folder must be writable, and is)",
    "pp solve --time-limit 1000000": "the solver's search time is the user's own bound "
    "(tests/cli/test_budgets.py); it stops at the first proof of optimality",
    "pp simulate -s 1f1b --straggler 1:1e15": "1e15 is the largest real nobubble takes "
    "(validation.MAX_REAL); the bubble is near 100%, which is what such a straggler means",
    "pp run -s 1f1b -p 2 --no-predict --plot x.png": "the plot draws the measured step alone "
    "when nothing was simulated (tests/cli/test_pp_run.py::test_profile_plan_run_chain): "
    "neither flag is ignored",
    "trace summary {trace_bigpid}": "a pid of 1e30 is a rank number, not a size: nothing is "
    "allocated per rank number",
}


def hostile_files(root: Path) -> dict[str, str]:
    """Write the files the cases name, under ``root``; returns ``{name: path}``."""
    from nobubble.pipeline.schedules import get_schedule

    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}

    def put(name: str, text: str | bytes, file: str | None = None) -> None:
        path = root / (file or name)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        paths[name] = str(path)

    (root / "folder").mkdir(exist_ok=True)
    paths.update(dir=str(root / "folder"), missing=str(root / "nowhere" / "none.csv"),
                 missing_dir=str(root / "nowhere"), out=str(root / "out.json"))  # fmt: skip
    put("file", "a regular file\n", "file.txt")
    put("empty", "", "empty.json")
    put("garbage", "hello, world\n{not json", "garbage.json")
    put("binary", bytes(range(128, 256)) * 4, "binary.csv")
    put("csv", get_schedule("1f1b", num_ranks=2, num_microbatches=4).to_csv(), "s.csv")
    put("bigmb", "0F999999999999,0I999999999999,0W999999999999\n", "bigmb.csv")
    put("badorder", "0I0,0W0,0F0\n", "badorder.csv")
    put("userpy", "def factory():\n    raise RuntimeError('never called')\n", "user.py")
    put("broken", "def factory(:\n", "broken.py")
    stage = {"stage": 0, "blocks": [0, 1, 2], "t_f": 1.0, "t_b": 1.0, "t_w": 1.0,
             "t_bw_fused": 2.0, "mem_f": 1000, "mem_w": 1000, "bw_ratio": 1.0,
             "out_bytes": 100}  # fmt: skip
    profile = {"model": "gpt", "microbatch_size": 2, "t_comm": 0.1, "activation_bytes": 100,
               "stages": [stage, stage | {"stage": 1, "blocks": [3, 4, 5]}]}  # fmt: skip
    put("profile", json.dumps(profile), "profile.json")
    huge = profile | {"stages": [stage | {"t_f": 1e308}, stage | {"stage": 1}]}
    put("profile_huge", json.dumps(huge), "profile_huge.json")
    event = {"name": "F0", "ph": "X", "ts": 0.0, "dur": 1.0, "pid": 0, "tid": 0}

    def trace(name: str, *events: dict) -> None:
        put(name, json.dumps({"traceEvents": list(events)}), f"{name}.json")

    trace("trace", event, event | {"ts": 2.0})
    trace("trace_huge", event | {"ts": 1e308, "dur": 1e308})
    trace("trace_nan", event | {"ts": float("nan")})
    trace("trace_inf", event | {"dur": float("inf")})
    trace("trace_bigdur", event | {"dur": 1e20})
    trace("trace_neg", event | {"dur": -1.0})
    trace("trace_lacks", {k: v for k, v in event.items() if k != "ts"})
    trace("trace_strts", event | {"ts": "soon"})
    trace("trace_pidstr", event | {"pid": "rank zero"})
    trace("trace_bigpid", event | {"pid": 10**30})
    put("trace_scalar", "5", "trace_scalar.json")
    put("trace_events5", '{"traceEvents": 5}', "trace_events5.json")
    put("trace_deep", "[" * 100_000 + "]" * 100_000, "trace_deep.json")
    locked = root / "locked.json"
    (root / f".{locked.name}.lock").write_text(f"{os.getpid()}\n")  # this live process claims it
    paths["locked"] = str(locked)
    return paths


def argv_of(case: str, paths: dict[str, str]) -> list[str]:
    return [word.format(**paths) for word in case.split()]


ALL = [(command, case, needle) for command, cases in CASES.items() for case, needle in cases]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    return hostile_files(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def _workroot(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture
def workdir(_workroot: Path) -> Iterator[Path]:
    """The cases' working folder, one for all (a fresh tmp_path each would cost more than the
    case): empty when a case starts, emptied after it."""
    yield _workroot
    for path in _workroot.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def test_every_command_has_at_least_15_hostile_cases() -> None:
    commands = {"pp show", "pp simulate", "pp compare", "pp export", "pp validate", "pp solve",
                "pp frontier", "pp profile", "pp plan", "pp run", "trace merge", "trace summary",
                "demo"}  # fmt: skip
    assert set(CASES) == commands
    counts = {command: len(cases) for command, cases in CASES.items()}
    assert min(counts.values()) >= 15, counts
    for command, cases in CASES.items():
        assert all(case.startswith(command) for case, _ in cases), command


def _sees_a_gpu() -> bool:
    from nobubble.distributed.context import _gpu_build

    if _gpu_build() is False:  # a CPU build of torch: told without importing it
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("case", sorted(VALID))
def test_the_valid_look_alikes_pass_the_parser(case: str, paths) -> None:
    """What ``VALID`` accepts on purpose gets past the argument checks (running it is the
    command's own tests' work)."""
    from nobubble.cli import build_parser

    args = build_parser().parse_args(argv_of(case, paths))
    assert args.func is not None


@pytest.mark.parametrize(("command", "case", "needle"), ALL, ids=[case for _, case, _ in ALL])
def test_hostile_input_is_refused_in_one_line(
    command: str, case: str, needle: str, paths, capsys, monkeypatch, workdir
) -> None:
    if "--device cuda" in case and _sees_a_gpu():
        pytest.skip("this machine has a GPU: --device cuda is valid here")
    monkeypatch.chdir(workdir)  # whatever a case would write by default lands here
    try:
        rc = main(argv_of(case, paths))
    except SystemExit as exc:  # argparse's own refusals exit from inside the parser
        rc = exc.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert (rc, out, len(lines)) == (2, "", 1), (rc, out, err)
    assert needle.format(**paths) in lines[0], lines[0]
    assert "Traceback" not in err and list(workdir.iterdir()) == [], list(workdir.iterdir())


# -- the long tier: real processes, timed ---------------------------------------------------
SUBPROCESS_CASES = [
    "pp show -p 1000000000 -m 1",
    "pp run -s 1f1b -p 2 --steps 1000000000",
    "pp profile --heads 3",
    "pp plan --arch mlp --vocab 8",
    "pp run -s 1f1b -p 2 --trace {locked}",
    "trace summary {trace_huge}",
]


@pytest.mark.long
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_hostile_input_is_refused_by_a_real_process_within_2_s(case: str, tmp_path) -> None:
    """The whole command, interpreter start-up included, refuses in under 2 s, before it
    imports torch, and leaves no process and no file behind."""
    paths = hostile_files(tmp_path / "files")
    work = tmp_path / "work"  # the command's folder: whatever it would write by default
    work.mkdir()
    before = sorted(tmp_path.rglob("*"))
    report = tmp_path.parent / f"{tmp_path.name}-report.json"
    probe = Path(__file__).with_name("refusal_probe.py")
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(probe), str(report), *argv_of(case, paths)],
                         capture_output=True, text=True, timeout=60, cwd=work)  # fmt: skip
    took = time.monotonic() - start
    assert (out.returncode, out.stdout, len(out.stderr.strip().splitlines())) == (2, "", 1), out
    assert took < 2.0, f"{case}: refused after {took:.1f} s"
    left = json.loads(report.read_text())
    assert left == {"torch": False, "children": []}, f"{case}: {left}"
    assert sorted(tmp_path.rglob("*")) == before  # no temporary, no claim, no folder
