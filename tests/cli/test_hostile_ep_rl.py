"""A hostile user's sweep of ``ep bench|balance|train`` and ``rl train|compare|reward-server``.

Every case in :data:`CASES` must be refused the way a user mistake is: exit status 2, exactly
one line on stderr (containing the case's needle), nothing on stdout, and before any work -
the functions that do each command's work, and process start-up itself, are tripwires here
(:func:`tripwires`), so a case that is accepted fails with "work started" instead of running.
The cases run in process (a subprocess each would cost ~1.5 s of start-up); the long tier
runs a few through a real ``python -m nobubble`` and times the refusal.

``{tmp}`` in an argv is the test's own folder, which holds the broken user modules of
:data:`USER_FILES` and is on ``sys.path`` (so ``nb_raises:fn`` imports ``nb_raises.py``).
Inputs a hostile user might try that are in fact valid are in :data:`VALID`, each with the
reason, and are checked to reach the work.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nobubble.cli import main

BIG = str(10**9)
HUGE = str(10**15)

USER_FILES = {
    "nb_raises.py": "raise RuntimeError('boom at import')\n",
    "nb_syntax.py": "def fn(prompt, response)\n    return 1.0\n",
    "nb_empty.py": "'''has no attributes that anyone asks for'''\n",
    "nb_rewards.py": (
        "def no_args():\n    return 1.0\n\n"
        "def three(prompt, response, extra):\n    return 1.0\n\n"
        "NOT_CALLABLE = 3\n"
    ),
}

# loads files (--weights): name -> text
WEIGHTS = {
    "w_empty.txt": "",
    "w_huge.json": "[[1e308, 1, 1, 1]]",
    "w_zero.json": "[[0, 0, 0, 0]]",
    "w_nan.txt": "1 nan 2 3\n",
    "w_words.txt": "a b c d\n",
    "w_ragged.json": "[[1, 2, 3, 4], [1, 2]]",
    "w_object.json": '{"loads": [1, 2, 3, 4]}',
    "w_negative.json": "[[5, -1, 2, 3]]",
    "w_ok.json": "[[5, 1, 2, 3]]",
}

EB = ["ep", "bench"]
BAL = ["ep", "balance", "--experts", "4", "--gpus", "2"]
ET = ["ep", "train"]
RT = ["rl", "train"]
RC = ["rl", "compare"]
RS = ["rl", "reward-server"]
ENV = ["--env", "CartPole-v1"]

CASES: dict[str, list[tuple[list[str], str]]] = {
    "ep bench": [
        ([*EB, "--ranks", "1"], "--ranks 1"),
        ([*EB, "--ranks", "0"], "--ranks"),
        ([*EB, "--ranks", "-4"], "--ranks"),
        ([*EB, "--ranks", "128"], "128 processes"),
        ([*EB, "--warmup", BIG], "--warmup"),
        ([*EB, "--iters", BIG], "--iters"),
        ([*EB, "--tokens", BIG], "GiB"),
        ([*EB, "--hidden", BIG], "GiB"),
        ([*EB, "--experts", BIG, "--topk", "1"], "GiB"),
        ([*EB, "--topk", "300"], "topk=300"),
        ([*EB, "--experts", "6"], "6"),
        ([*EB, "--timeout", "1e308"], "finite"),
        ([*EB, "--timeout", "nan"], "finite"),
        ([*EB, "--timeout", "inf"], "finite"),
        ([*EB, "--timeout", "0"], "> 0"),
        ([*EB, "--tokens", "many"], "not an integer"),
        ([*EB, "--transport", "carrier-pigeon"], "auto, shm or dist"),
        ([*EB, "--transport", "shm,dist", "--plot", "{tmp}/x.png"], "--plot"),
        ([*EB, "--plot", "{tmp}/x.txt"], ".png"),
        ([*EB, "--plot", "/proc/x.png"], "/proc/x.png"),
        ([*EB, "--plot", "{tmp}"], "folder"),
        ([*EB, "--seed", "-1"], "--seed"),
    ],
    "ep balance": [
        (["ep", "balance", "--experts", BIG, "--gpus", "8"], "--force"),
        (["ep", "balance", "--experts", "8", "--gpus", "8", "--layers", BIG], "--force"),
        (["ep", "balance", "--experts", "8", "--gpus", BIG], "num_gpus=1000000000"),
        (["ep", "balance", "--experts", "8", "--gpus", "8", "--redundant", BIG], "fewer replicas"),
        ([*BAL, "--skew", "zipf:1e308"], "finite"),
        ([*BAL, "--skew", "zipf:nan"], "finite"),
        ([*BAL, "--skew", "zipf:inf"], "finite"),
        ([*BAL, "--skew", "zipf:-1"], "> 0"),
        ([*BAL, "--skew", "gauss:1"], "zipf:S or pareto:A"),
        ([*BAL, "--tokens", str(10**30)], "--tokens"),
        ([*BAL, "--weights", "/dev/null"], "/dev/null"),
        ([*BAL, "--weights", "{tmp}/w_empty.txt"], "no numbers"),
        ([*BAL, "--weights", "{tmp}/w_huge.json"], "finite"),
        ([*BAL, "--weights", "{tmp}/w_zero.json"], "all zero"),
        ([*BAL, "--weights", "{tmp}/w_nan.txt"], "finite"),
        ([*BAL, "--weights", "{tmp}/w_words.txt"], "w_words.txt"),
        ([*BAL, "--weights", "{tmp}/w_ragged.json"], "equal length"),
        ([*BAL, "--weights", "{tmp}/w_object.json"], "w_object.json"),
        ([*BAL, "--weights", "{tmp}/w_negative.json"], "negative"),
        ([*BAL, "--weights", "{tmp}"], "folder"),
        ([*BAL, "--weights", "{tmp}/missing.json"], "no such file"),
        ([*BAL, "--weights", "{tmp}/w_ok.json", "--layers", "3"], "--layers"),
        ([*BAL, "--weights", "{tmp}/w_ok.json", "--tokens", "5"], "--tokens"),
        (["ep", "balance", "--experts", "8", "--gpus", "3"], "3"),
        (["ep", "balance", "--experts", "8", "--gpus", "8", "--nodes", "3"], "3"),
        ([*BAL, "--plot", "{tmp}/x.txt"], ".png"),
        ([*BAL, "--plot", "/proc/x.png"], "/proc/x.png"),
    ],
    "ep train": [
        ([*ET, "--experts", str(10**6)], "--force"),
        ([*ET, "--batch", BIG], "--force"),
        ([*ET, "--steps", BIG], "--force"),
        ([*ET, "--ep", "1", "--rebalance-every", "2"], "ep 1"),
        ([*ET, "--ranks", "0"], "--ranks"),
        ([*ET, "--ranks", "1000"], "processes"),
        ([*ET, "--steps", "-1"], "--steps"),
        ([*ET, "--lr", "1e308"], "finite"),
        ([*ET, "--lr", "nan"], "finite"),
        ([*ET, "--lr", "inf"], "finite"),
        ([*ET, "--timeout", "1e308"], "finite"),
        ([*ET, "--ep", "3"], "ep=3"),
        ([*ET, "--redundant", "3"], "num_redundant=3"),
        ([*ET, "--topk", "100"], "topk"),
        ([*ET, "--experts", "lots"], "not an integer"),
        ([*ET, "--plot", "{tmp}/x.txt"], ".png"),
        ([*ET, "--plot", "/proc/x.png"], "/proc/x.png"),
        ([*ET, "--plot", "{tmp}"], "folder"),
        ([*ET, "--plot", "/dev/null"], "/dev/null"),
    ],
    "rl train": [
        ([*RT, "--engine", "ray", "--address", "127.0.0.1:1"], "no Ray cluster answers"),
        ([*RT, "--steps", BIG], "--force"),
        ([*RT, "--policy-kwargs", '{"hidden": 1e9}'], "hidden"),
        ([*RT, "--policy-kwargs", '{"hidden": 1000000}'], "--force"),
        ([*RT, "--policy-kwargs", '{"bogus": 1}'], "bogus"),
        ([*RT, "--task-kwargs", '{"bogus": 1}'], "bogus"),
        ([*RT, "--task-kwargs", "not json"], "not JSON"),
        ([*RT, "--reward", "task=1e308"], "finite"),
        ([*RT, "--reward", "task=nan"], "finite"),
        ([*RT, "--engine", "local", "--address", "127.0.0.1:6379"], "engine"),
        ([*RT, "--task", "nb_raises:Task"], "boom at import"),
        ([*RT, "--task", "{tmp}/nb_syntax.py:Task"], "SyntaxError"),
        ([*RT, "--task", "nb_empty:Task"], "no attribute"),
        ([*RT, "--policy", "nb_raises:make"], "boom at import"),
        ([*RT, "--policy", "nb_syntax:make"], "SyntaxError"),
        ([*RT, "--reward", "nb_rewards:no_args"], "(prompt, response)"),
        ([*RT, "--reward", "nb_rewards:three"], "(prompt, response)"),
        ([*RT, "--reward", "nb_raises:fn"], "boom at import"),
        ([*RT, "--reward", "nb_empty:fn"], "no attribute"),
        ([*RT, "--time-budget", "nan"], "finite"),
        ([*RT, "--time-budget", "1e308"], "finite"),
        ([*RT, "--time-budget", "0"], "> 0"),
        ([*RT, "--reward-failure-rate", "2"], "--reward-failure-rate 2.0: Reward"),
        ([*RT, "--reward-failure-rate", "-0.5"], "--reward-failure-rate"),
        ([*RT, "--target-accuracy", "2"], "target_accuracy"),
        ([*RT, "--group-size", "1"], "group_size=1"),
        ([*RT, "--replay-groups", "2"], "replay"),
        (
            [*RT, "--mode", "fully-async", "--drop-staleness", "10", "--max-staleness", "2"],
            "drop_staleness",
        ),  # fmt: skip
        ([*RT, "--resume", "--checkpoint-dir", "{tmp}/empty"], "no checkpoint"),
        ([*RT, "--checkpoint-every", "5"], "checkpoint_dir"),
        ([*RT, "--learners", "100"], "learners=100"),
        ([*RT, "--out", "/proc/x"], "/proc/x"),
        ([*RT, "--out", "{tmp}/nb_empty.py"], "nb_empty.py"),
        ([*RT, *ENV, "--actors", "1000"], "processes"),
        ([*RT, *ENV, "--envs-per-actor", str(10**6)], "GiB"),
        ([*RT, *ENV, "--steps", HUGE], "--force"),
        ([*RT, *ENV, "--group-size", "4"], "--group-size"),
        ([*RT, *ENV, "--mode", "fully-async"], "--mode is not read with --env"),
        ([*RT, "--weight-check-every", "2"], "--partial-rollouts"),
        ([*RT, "--env", "NoSuchEnv-v9"], "NoSuchEnv-v9"),
    ],
    "rl compare": [
        ([*RC, "--steps", BIG], "--force"),
        ([*RC, "--etas", "4,8"], "--ablation"),
        ([*RC, "--max-staleness", "2"], "--max-staleness"),
        ([*RC, "--ablation", "--etas", "0"], "--etas"),
        ([*RC, "--ablation", "--etas", "a,b"], "--etas"),
        ([*RC, "--group-size", str(10**6)], "GiB"),
        ([*RC, "--policy-kwargs", '{"hidden": 1e9}'], "hidden"),
        ([*RC, "--reward", "task=1e308"], "finite"),
        ([*RC, "--engine", "local", "--address", "127.0.0.1:6379"], "engine"),
        ([*RC, "--task", "nb_raises:Task"], "boom at import"),
        ([*RC, "--policy", "{tmp}/nb_syntax.py:make"], "SyntaxError"),
        ([*RC, "--reward", "nb_rewards:no_args"], "(prompt, response)"),
        ([*RC, "--task-kwargs", '{"bogus": 1}'], "bogus"),
        ([*RC, "--time-budget", "inf"], "finite"),
        ([*RC, "--reward-failure-rate", "1.5"], "failure_rate=1.5 must be in [0, 1]"),
        ([*RC, "--out", "/proc/x"], "/proc/x"),
        ([*RC, *ENV, "--actors", "1000"], "processes"),
        ([*RC, *ENV, "--steps", HUGE], "--force"),
        ([*RC, *ENV, "--etas", "4"], "--etas"),
        ([*RC, "--env", "NoSuchEnv-v9"], "NoSuchEnv-v9"),
    ],
    "rl reward-server": [
        ([*RS, "--reward", "nb_rewards:no_args"], "(prompt, response)"),
        ([*RS, "--reward", "nb_rewards:three"], "(prompt, response)"),
        ([*RS, "--reward", "nb_rewards:NOT_CALLABLE"], "not callable"),
        ([*RS, "--reward", "nb_raises:fn"], "boom at import"),
        ([*RS, "--reward", "nb_syntax:fn"], "SyntaxError"),
        ([*RS, "--reward", "{tmp}/nb_syntax.py:fn"], "SyntaxError"),
        ([*RS, "--reward", "nb_empty:fn"], "no attribute"),
        ([*RS, "--reward", "no_such_module_here:fn"], "not importable"),
        ([*RS, "--reward", "{tmp}/missing.py:fn"], "does not exist"),
        ([*RS, "--reward", "just-a-name"], "import path"),
        ([*RS, "--task", "nb_raises:Task"], "boom at import"),
        ([*RS, "--task", "no-such-task"], "no-such-task"),
        ([*RS, "--task", "digits", "--port", "70000"], "--port 70000"),
        ([*RS, "--task", "digits", "--port", "-1"], "--port"),
        ([*RS, "--task", "digits", "--port", "http"], "not an integer"),
        ([*RS, "--task", "digits", "--host", "999.0.0.1"], "999.0.0.1"),
        ([*RS, "--task", "digits", "--reward", "nb_rewards:three"], "not allowed with"),
        ([*RS], "required"),
    ],
}

VALID: dict[str, list[tuple[list[str], str]]] = {
    # inputs that look hostile and are not: each reaches the work (checked below)
    "ep bench": [
        (
            [*EB, "--timeout", "1e12"],
            "a limit far away is no limit, not an error: the run ends when its work does",
        ),  # fmt: skip
        (
            [*EB, "--iters", "1000"],
            "the largest accepted --iters: a 4-rank bench of 1,000 "
            "iterations of the default sizes ends in minutes",
        ),  # fmt: skip
    ],
    "ep balance": [
        (
            ["ep", "balance", "--experts", "8", "--gpus", "8", "--skew", "zipf:1e15"],
            "the largest finite skew: every load on one expert, which EPLB replicates",
        ),  # fmt: skip
        (
            ["ep", "balance", "--experts", "8", "--gpus", "8", "--layers", "1000"],
            "a thousand layers of 8 experts is 8,000 loads",
        ),  # fmt: skip
    ],
    "ep train": [
        (
            [*ET, "--steps", "50000"],
            "50,000 steps at the fastest 10 ms a step fit in the "
            "600 s --timeout; the bound is a least estimate, not a guess at intent",
        ),  # fmt: skip
        (
            [*ET, "--rebalance-every", "1"],
            "without --redundant, online EPLB still moves whole "
            "experts between the expert-parallel ranks: --ranks 2 --steps 6 --rebalance-every 2 "
            "moved 4 experts of layer 0 at step 2, rank imbalance 1.316 -> 1.004",
        ),  # fmt: skip
    ],
    "rl train": [
        (
            [*RT, "--steps", BIG, "--time-budget", "60"],
            "the time budget ends the run; --steps is then only an upper bound",
        ),  # fmt: skip
        ([*RT, "--policy-kwargs", '{"hidden": 512}'], "a wider char policy that fits"),
        ([*RT, "--reward", "task=1e15"], "the largest finite weight"),
    ],
    "rl compare": [
        ([*RC, "--steps", "20", "--ablation", "--etas", "2,4"], "a short ablation"),
    ],
    "rl reward-server": [
        ([*RS, "--task", "digits", "--port", "0"], "port 0 = any free port"),
    ],
}

ENDED_AT_RUN_TIME = [
    # hostile, and refused once the run starts (exit 1, one line), by design; their tests:
    (
        [*RT, "--reward-failure-rate", "1"],
        "every reward attempt fails: the reward watch ends "
        "the run after 8 groups, exit 1: tests/cli/test_rl.py",
    ),
    (
        [*RT, "--reward-url", "http://127.0.0.1:1/score"],
        "a service that is down now may be up "
        "in a second; the reward watch ends a run whose service never answers, exit 1",
    ),
]

# the command lines of the docs, README and Makefile: every one must still be accepted
DOCUMENTED = [
    [*EB],
    [
        *EB,
        "--ranks",
        "4",
        "--tokens",
        "4096",
        "--hidden",
        "7168",
        "--experts",
        "256",
        "--topk",
        "8",
        "--dtype",
        "bf16",
        "--transport",
        "dist",
    ],  # fmt: skip
    [
        "ep",
        "balance",
        "--experts",
        "12",
        "--gpus",
        "8",
        "--nodes",
        "2",
        "--redundant",
        "4",
        "--groups",
        "4",
        "--weights",
        "eplb_example.json",
    ],  # fmt: skip
    [*ET],
    [*ET, "--ranks", "4", "--check-dense"],
    [*RT],
    [
        *RT,
        "--mode",
        "sync",
        "--seed",
        "0",
        "--steps",
        "100000",
        "--time-budget",
        "300",
        "--target-accuracy",
        "0.9",
    ],  # fmt: skip
    [*RT, "--mode", "fully-async", "--checkpoint-dir", "{tmp}/ckpt", "--checkpoint-every", "10"],
    [*RT, "--learners", "2"],
    [*RT, "--env", "guess-number"],
    [*RT, *ENV, "--arch", "seed", "--actors", "2", "--envs-per-actor", "8"],
    [*RC],
    [*RC, "--ablation"],
    [*RC, *ENV, "--time-budget", "30"],
    [*RS, "--task", "digits", "--port", "8000"],
]


class WorkStarted(BaseException):
    """Raised by a tripwire: the command got past its checks (a BaseException, so that the
    command's own ``except Exception`` cannot turn it into an exit status)."""


def _trip(*args, **kwargs):
    raise WorkStarted()


_SERVE = None


def _serve_then_trip(*args, **kwargs):
    """The reward server binds its port (a refused --host or --port is the command's to
    report), then stops: serving is the work."""
    _SERVE(*args, **kwargs).close()
    raise WorkStarted()


@pytest.fixture
def tripwires(monkeypatch, tmp_path):
    """Each command's work, and the start of any process, raise :class:`WorkStarted`; the
    user modules and loads files are written into ``tmp_path``, which is on ``sys.path``
    and the working folder (so default outputs land there)."""
    import multiprocessing.process

    import nobubble.bench.ep_dispatch
    import nobubble.bench.ep_train
    import nobubble.moe.balance.eplb
    import nobubble.rl
    import nobubble.rl.system.orchestrator
    import nobubble.rl.system.rewards

    global _SERVE
    _SERVE = nobubble.rl.system.rewards.RewardServer
    for module, name, *wire in [
        (nobubble.bench.ep_dispatch, "run_with_progress"),
        (nobubble.bench.ep_train, "run_training"),
        (nobubble.moe.balance.eplb, "rebalance_experts"),
        (nobubble.rl, "train"),
        (nobubble.rl.system.orchestrator, "run"),
        (nobubble.rl.system.rewards, "RewardServer", _serve_then_trip),
        (multiprocessing.process.BaseProcess, "start"),
        (subprocess.Popen, "__init__"),
    ]:
        monkeypatch.setattr(module, name, wire[0] if wire else _trip)
    files = {**USER_FILES, **WEIGHTS, "eplb_example.json": _eplb_example()}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "empty").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in USER_FILES:  # a later test must import them afresh
        sys.modules.pop(name.removesuffix(".py"), None)


def _eplb_example() -> str:
    """The loads of docs/moe/balance.md's example (EPLB's published one)."""
    return ("[[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86], "
            "[20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]")  # fmt: skip


def _argv(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        return int(exit_.code or 0)


def _flat(table: dict[str, list[tuple[list[str], str]]]) -> list[tuple[list[str], str]]:
    return [case for cases in table.values() for case in cases]


def test_every_subcommand_has_at_least_15_hostile_cases() -> None:
    assert set(CASES) == {"ep bench", "ep balance", "ep train", "rl train", "rl compare",
                          "rl reward-server"}  # fmt: skip
    for command, cases in CASES.items():
        assert len(cases) >= 15, f"{command}: {len(cases)} cases"
        assert all(" ".join(argv[:2]) == command for argv, _ in cases), command


@pytest.mark.parametrize(
    ("argv", "needle"), _flat(CASES), ids=[" ".join(a) for a, _ in _flat(CASES)]
)
def test_hostile_input_is_refused_in_one_line_before_any_work(tripwires, capsys, argv, needle):
    argv = _argv(argv, tripwires)
    try:
        rc = _run(argv)
    except WorkStarted:
        pytest.fail(f"{argv}: accepted, the work started")
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and out == "", (rc, out, err)
    assert needle.replace("{tmp}", str(tripwires)) in lines[0], lines[0]


VALID_AND_DOCUMENTED = [argv for argv, _ in _flat(VALID)] + DOCUMENTED


@pytest.mark.parametrize(
    "argv", VALID_AND_DOCUMENTED, ids=[" ".join(a) for a in VALID_AND_DOCUMENTED]
)
def test_valid_and_documented_inputs_reach_the_work(tripwires, capsys, argv):
    with pytest.raises(WorkStarted):
        rc = _run(_argv(argv, tripwires))
        pytest.fail(f"{argv}: refused with {rc}: {capsys.readouterr().err}")


TIMED = [
    ([*EB, "--warmup", BIG], "--warmup"),
    (["ep", "balance", "--experts", BIG, "--gpus", "8"], "--force"),
    ([*ET, "--experts", str(10**6)], "--force"),
    ([*RT, "--policy-kwargs", '{"hidden": 1e9}'], "hidden"),
    ([*RT, *ENV, "--actors", "1000"], "processes"),
    ([*RS, "--reward", "{tmp}/nb_rewards.py:no_args"], "(prompt, response)"),
]


@pytest.mark.long
@pytest.mark.parametrize(("argv", "needle"), TIMED, ids=[" ".join(a) for a, _ in TIMED])
def test_a_real_command_refuses_within_2_s_and_leaves_no_process(tmp_path, argv, needle):
    """Through ``python -m nobubble`` in a session of its own: exit 2, one line, nothing on
    stdout, under 2 s past the start-up (the interpreter's, the package's and torch's import,
    timed in a child of its own just before), and nothing left in the session."""
    for name, text in USER_FILES.items():
        (tmp_path / name).write_text(text)
    start = time.monotonic()  # start-up: the interpreter, the package and torch's import
    baseline = subprocess.run([sys.executable, "-c", "import nobubble.cli, torch"], timeout=60)
    startup = time.monotonic() - start
    assert baseline.returncode == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "nobubble", *_argv(argv, tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env, start_new_session=True)  # fmt: skip
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - start - startup
    lines = err.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and out == "", (out, err)
    assert needle in lines[0]
    assert took < 2, f"{argv}: refused {took:.1f}s after start-up"
    from tests.cli.session_procs import session_members

    assert session_members(proc.pid) == []


@pytest.mark.long
def test_an_unreachable_ray_address_is_one_line_with_no_blank_line_before_it(tmp_path):
    """Refused before any work by the Ray engine's probe (exit 2): stderr holds exactly the
    one line - no blank line left by a progress bar off a terminal."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    argv = ["rl", "train", "--engine", "ray", "--address", f"127.0.0.1:{port}", "--steps", "2"]
    out = subprocess.run([sys.executable, "-m", "nobubble", *argv], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("nobubble rl: error:"), out
    assert f"--address 127.0.0.1:{port}: no Ray cluster answers" in out.stderr


RL_FLAG_CONTRADICTIONS = [
    ([*RT, "--group-size", "1"], "group_size=1"),
    ([*RT, "--replay-groups", "2"], "groups_per_step=2"),
    (
        [*RT, "--mode", "fully-async", "--max-staleness", "2", "--drop-staleness", "10"],
        "drop_staleness=10",
    ),  # fmt: skip
    ([*RT, "--resume", "--checkpoint-dir", "{tmp}"], "holds no checkpoint"),
    ([*RT, "--engine", "local", "--address", "127.0.0.1:1"], "ray_address"),
    ([*RC, "--group-size", "1"], "group_size=1"),
]


@pytest.mark.long
@pytest.mark.parametrize(
    ("argv", "needle"), RL_FLAG_CONTRADICTIONS, ids=[" ".join(a) for a, _ in RL_FLAG_CONTRADICTIONS]
)
def test_rl_flag_contradictions_are_refused_within_2_s_of_the_command(tmp_path, argv, needle):
    """Checked before torch is imported, so the whole ``python -m nobubble`` - interpreter
    start-up included - takes under 2 s (torch's import alone takes ~3 s here)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "nobubble", *_argv(argv, tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - start
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and out.stdout == "", out
    assert needle in lines[0], lines[0]
    assert took < 2, f"{argv}: refused after {took:.1f}s"


def test_the_rl_cli_and_configs_import_no_torch_and_refuse_a_contradiction_without_it():
    """What ``rl train|compare`` read before their flag checks loads no torch, and a
    contradictory :class:`RunConfig` is refused before it would import any."""
    code = (
        "import nobubble.cli.rl, nobubble.rl.system.config, nobubble.rl.actor_learner.config, sys\n"
        "assert 'torch' not in sys.modules, 'torch imported by the modules'\n"
        "from nobubble.rl.system.config import RunConfig\n"
        "try:\n"
        "    RunConfig(group_size=1)\n"
        "except ValueError as err:\n"
        "    assert 'group_size=1' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('group_size=1 was accepted')\n"
        "assert 'torch' not in sys.modules, 'torch imported by the refusal'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
