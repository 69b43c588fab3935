"""Options shared by the ``pp`` commands: pipeline shape, per-rank costs, the schedule, the
dispatch policy and its perturbations.

Costs on the command line are per *rank* (``--tf/--tb/--tw``: one microbatch through one
rank's share of the model; ``--tcomm``: one transfer between ranks); ``--model 1.5B`` takes
the Zero Bubble paper's measured times and memory model. Memory limits are in units of M_F.
``--dispatch static|handshake`` picks how ranks choose their next op, ``--jitter``,
``--straggler`` and ``--seed`` perturb the op durations
(:mod:`nobubble.pipeline.dispatch`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nobubble.cli.flags import (
    Flag,
    add_config_flags,
    apply_flags,
    config_from_flags,
    flags_given,
    integer,
    real,
)
from nobubble.cli.util import (
    UsageError,
    check_budget,
    check_steps,
    nonneg_float,
    positive_float,
    positive_int,
    seed_int,
)
from nobubble.pipeline.costs import PAPER_TIMES

if TYPE_CHECKING:
    from nobubble.pipeline.runtime.models import ModelConfig

__all__ = [
    "DISPATCH_CHOICES",
    "BUILTIN_MODELS",
    "add_size",
    "add_shape",
    "add_costs",
    "add_dispatch",
    "add_model",
    "add_launch",
    "straggler_arg",
    "check_size",
    "costs_from_args",
    "mem_limit_from_args",
    "schedule_from_args",
    "perturbation_from_args",
    "read_schedule_csv",
    "read_profile_json",
    "is_user_model",
    "model_from_args",
    "given_model_flags",
    "check_factory_flags",
    "check_launch",
    "check_time",
]

# nobubble.pipeline.dispatch.DISPATCH_POLICIES, spelt out so that building the parser
# imports no pipeline code (a test keeps the two equal)
DISPATCH_CHOICES = ("static", "handshake")


def add_size(
    p: argparse.ArgumentParser,
    *,
    ranks: int | None = 4,
    ranks_required: bool | None = None,
    microbatches: int | None = 8,
) -> None:
    """``--ranks/-p`` (``ranks=None`` makes it required unless ``ranks_required=False``),
    ``--microbatches/-m`` (``microbatches=None``: the command decides) and ``--force`` (skip
    the work budget, see :func:`check_size`). ``--ranks`` is always ranks: a schedule with
    ``--chunks`` V has P x V stages (``pp profile --stages`` counts stages)."""
    required = ranks is None if ranks_required is None else ranks_required
    p.add_argument("--ranks", "-p", type=positive_int, default=ranks, required=required,
                   help="pipeline ranks P")  # fmt: skip
    p.add_argument("--microbatches", "-m", type=positive_int, default=microbatches,
                   help="microbatches M")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="run sizes past the work budget (they may take minutes or GBs)")  # fmt: skip


def check_size(
    args: argparse.Namespace, budget: str = "default", *, v_memory: bool = False
) -> None:
    """Refuse, before any work, a pipeline whose op count passes the command's budget
    (:func:`~nobubble.pipeline.schedules.budget.check_ops`: ``budget`` and, when ``-s`` names
    a V generator or ``v_memory``, theirs) unless ``--force``."""
    from nobubble.pipeline.schedules.budget import check_ops

    if getattr(args, "force", False) or None in (
        getattr(args, n, None) for n in ("ranks", "microbatches")
    ):
        return  # forced, or a command whose size comes from a file (pp validate)
    try:
        check_ops(args.ranks, args.microbatches, num_chunks=getattr(args, "chunks", None),
                  budget=budget, schedule=getattr(args, "schedule", None), v_memory=v_memory)  # fmt: skip
    except ValueError as err:
        raise UsageError(f"--ranks/--microbatches: {err}, or --force") from None


def add_shape(
    p: argparse.ArgumentParser,
    *,
    schedule: bool = True,
    chunks: int | None = None,
    chunks_help: str = "chunks per rank (interleaved-1f1b; default 2)",
) -> None:
    """The schedule's name (unless ``schedule=False``), its size, and ``--chunks/-v``."""
    if schedule:
        p.add_argument("--schedule", "-s", default="zb-h1", help="schedule name (default zb-h1)")
    add_size(p)
    p.add_argument("--chunks", "-v", type=positive_int, default=chunks, help=chunks_help)


def add_costs(
    p: argparse.ArgumentParser,
    *,
    mem_limit_help: str | None = "zb-1p/zb-2p (and --dispatch handshake) activation limit "
    "per rank in units of M_F (default P and 2P; handshake: the order's peak)",
) -> None:
    """Per-rank times (``--model``, ``--tf/--tb/--tw/--tcomm``), memory per microbatch (a
    transformer shape or ``--mem-f/-b/-w``) and ``--mem-limit`` in units of M_F (none when
    ``mem_limit_help`` is None: a command that no limit changes)."""
    g = p.add_argument_group("costs (per rank; default 1, 1, 1, 0 or --model's)")
    g.add_argument("--model", choices=sorted(PAPER_TIMES), help="the paper's measured costs")
    g.add_argument("--tf", type=_rank_costs, help="forward time of one microbatch; one value, "
                   "or one per rank comma-separated (e.g. 20,18,18,24 for embedding/head)")  # fmt: skip
    g.add_argument("--tb", type=_rank_costs, help="input-gradient backward (B) time (or list)")
    g.add_argument("--tw", type=_rank_costs, help="weight-gradient backward (W) time (or list)")
    g.add_argument("--tcomm", type=nonneg_float, help="transfer time between ranks")
    m = p.add_argument_group("memory per microbatch (default: --model's, else the 1.5B shape)")
    m.add_argument("--hidden", type=positive_int, help="hidden size h (M_F = 34h + 5as)")
    m.add_argument("--heads", type=positive_int, help="attention heads a")
    m.add_argument("--seq", type=positive_int, help="sequence length s")
    m.add_argument("--mem-f", type=positive_float, help="activation memory an F stores")
    m.add_argument("--mem-b", type=nonneg_float, help="memory a B frees")
    m.add_argument("--mem-w", type=nonneg_float, help="memory a W frees")
    if mem_limit_help is not None:
        p.add_argument("--mem-limit", type=positive_float, default=None, help=mem_limit_help)


def _rank_costs(text: str) -> tuple[float, ...]:
    """argparse type: a positive number, or comma-separated positive numbers (one per rank)."""
    return tuple(positive_float(part) for part in text.split(","))


def costs_from_args(args: argparse.Namespace):
    """Per-rank :meth:`CostModel.from_settings <nobubble.pipeline.costs.CostModel.from_settings>`
    of the cost and memory flags (which refuses contradictory ones), within the work budget."""
    from nobubble.pipeline.costs import CostModel

    check_size(args)
    return CostModel.from_settings(
        args.ranks, model=args.model, t_f=args.tf, t_b=args.tb, t_w=args.tw, t_comm=args.tcomm,
        hidden=args.hidden, heads=args.heads, seq=args.seq,
        mem_f=args.mem_f, mem_b=args.mem_b, mem_w=args.mem_w,
    )  # fmt: skip


def mem_limit_from_args(
    args: argparse.Namespace, costs, *, below_one: bool = False
) -> float | None:
    """``--mem-limit`` (in units of M_F, a rank's activations of one microbatch) in the
    costs' memory unit; None when not given. A limit below 1 is refused unless
    ``below_one`` (the exact solver explains why it is infeasible)."""
    if getattr(args, "mem_limit", None) is None:
        return None
    if args.mem_limit < 1 and not below_one:
        raise UsageError(f"--mem-limit {args.mem_limit:g} is below one microbatch's activations "
                         "(the unit is M_F); give at least 1")  # fmt: skip
    return args.mem_limit * max(costs.mem_f)


def schedule_from_args(args: argparse.Namespace, costs, *, limit_elsewhere: bool = False):
    """The schedule ``--schedule`` names; ``--mem-limit`` steers zb-1p / zb-2p (which the
    registry refuses for other schedules, unless ``limit_elsewhere``: the handshake's)."""
    from nobubble.pipeline.schedules import get_schedule

    check_size(args)
    mem_limit = mem_limit_from_args(args, costs)
    if limit_elsewhere and args.schedule not in ("zb-1p", "zb-2p"):
        mem_limit = None
    return get_schedule(args.schedule, num_ranks=args.ranks, num_microbatches=args.microbatches,
                        costs=costs, mem_limit=mem_limit, num_chunks=getattr(args, "chunks", None))  # fmt: skip


def read_schedule_csv(path: Path, flag: str = ""):
    """:meth:`Schedule.read_csv <nobubble.pipeline.actions.Schedule.read_csv>` (``flag``: how
    the user gave the file, named in its error)."""
    from nobubble.pipeline.actions import Schedule

    try:
        return Schedule.read_csv(path)
    except ValueError as err:
        raise UsageError(f"{flag} {err}".strip()) from None


def read_profile_json(path: Path, flag: str) -> Any:
    """:meth:`Profile.read <nobubble.pipeline.runtime.profile_data.Profile.read>` (torch-free,
    so a file that is no profile is refused at once; ``flag`` is named in its error)."""
    from nobubble.pipeline.runtime.profile_data import Profile

    try:
        return Profile.read(path)
    except ValueError as err:
        raise UsageError(f"{flag} {err}") from None


def add_dispatch(p: argparse.ArgumentParser) -> None:
    """``--dispatch``, ``--jitter``, ``--straggler`` (repeatable) and ``--seed``."""
    g = p.add_argument_group("dispatch policy and perturbations")
    g.add_argument("--dispatch", choices=DISPATCH_CHOICES, default=None,
                   help="static: every rank walks the schedule's order (the default); "
                        "handshake: ranks pick their next op from what has arrived, guided "
                        "by the order, within --mem-limit (default: the order's peak)")  # fmt: skip
    g.add_argument("--jitter", type=nonneg_float, default=0.0, metavar="J",
                   help="each op's time times a seeded factor in [1-J, 1+J] (0 <= J < 1)")  # fmt: skip
    g.add_argument("--straggler", type=straggler_arg, action="append", default=[],
                   metavar="RANK:FACTOR[:STEPS]",
                   help="slow a rank's ops by FACTOR (e.g. 1:1.5), in steps STEPS: N (the first "
                        "N), A-B or A- (default all); repeatable")  # fmt: skip
    g.add_argument("--seed", type=seed_int, default=None, help="seed of the jitter draws "
                   "(default 0)")  # fmt: skip


def straggler_arg(text: str):
    """argparse type: ``RANK:FACTOR[:STEPS]`` as a Straggler."""
    from nobubble.pipeline.dispatch.perturb import parse_straggler

    try:
        return parse_straggler(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def perturbation_from_args(args: argparse.Namespace):
    """The Perturbation of ``--jitter/--straggler/--seed`` (the simulation refuses a
    straggler on a rank the pipeline does not have)."""
    from nobubble.pipeline.dispatch.perturb import Perturbation

    if args.seed is not None and not args.jitter:
        raise UsageError(f"--seed {args.seed} seeds the --jitter draws, and there are none; "
                         "add --jitter J or drop --seed")  # fmt: skip
    return Perturbation(jitter=args.jitter, stragglers=tuple(args.straggler),
                        seed=args.seed or 0)  # fmt: skip


BUILTIN_MODELS = ("gpt", "mlp")
"""``--model`` values that name a built-in model (:mod:`nobubble.pipeline.runtime.models`)."""
MODEL_FLAGS: tuple[Flag, ...] = (
    ("--layers", "num_layers", positive_int, "transformer / MLP blocks"),
    ("--hidden", "hidden", positive_int, "hidden size"),
    ("--heads", "num_heads", positive_int, "attention heads (gpt)"),
    ("--seq-len", "seq_len", positive_int, "tokens per sample (gpt)"),
    ("--vocab", "vocab_size", positive_int, "vocabulary (gpt)"),
)
"""The built-in model's size flags: :class:`~nobubble.pipeline.runtime.models.GPTConfig`'s
fields (:class:`~nobubble.pipeline.runtime.models.MLPConfig` has the first two), and its
defaults."""
RUN_DEFAULTS = {"arch": "gpt", "microbatch_size": 2, "seed": 0}
"""The other model flags' defaults (``--seed`` seeds the weights, the data and a factory)."""


def add_model(p: argparse.ArgumentParser) -> None:
    """The model: ``--model gpt|mlp|MODULE:FACTORY`` and the built-in model's size flags."""
    from nobubble.pipeline.runtime.models import GPTConfig

    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, metavar="gpt|mlp|MODULE:FACTORY",
                   help="a built-in model, or a factory returning (blocks, inputs, targets, "
                        "loss_fn): package.module:factory or path/to/file.py:factory")  # fmt: skip
    g.add_argument("--arch", choices=BUILTIN_MODELS, help="built-in model (default gpt)")
    add_config_flags(g, GPTConfig, MODEL_FLAGS)
    g.add_argument("--microbatch-size", type=positive_int, help="samples per mb (default 2)")
    g.add_argument("--seed", type=seed_int, help="weights, data and factory seed (default 0)")
    p.set_defaults(**RUN_DEFAULTS)


def is_user_model(spec: str | None) -> bool:
    """Whether ``--model`` names the user's factory rather than a built-in model."""
    return spec is not None and spec not in BUILTIN_MODELS


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    """The built-in model of ``--model gpt|mlp`` (else ``--arch``) and its size flags, checked
    by the config itself (torch-free); callers take ``--model MODULE:FACTORY`` elsewhere."""
    from nobubble.pipeline.runtime.models import GPTConfig, MLPConfig

    gpt = (args.model or args.arch) == "gpt"
    return config_from_flags(GPTConfig if gpt else MLPConfig, MODEL_FLAGS, args, seed=args.seed)


def given_model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags given (``--arch``, ``--microbatch-size``, ``--seed``: other than their
    default)."""
    given = [flag for flag, field, _, _ in MODEL_FLAGS if getattr(args, field) is not None]
    given += [f"--{dest.replace('_', '-')}" for dest, default in RUN_DEFAULTS.items()
              if getattr(args, dest) != default]  # fmt: skip
    return (["--model"] if args.model is not None else []) + given


def check_factory_flags(args: argparse.Namespace) -> None:
    """Refuse the built-in model's flags beside ``--model MODULE:FACTORY``, whose factory
    builds its own model (``--seed`` seeds it)."""
    if odd := [f for f in given_model_flags(args) if f not in ("--model", "--seed")]:
        raise UsageError(f"{', '.join(odd)}: the built-in models' flags; --model {args.model} "
                         "builds its own model, drop them")  # fmt: skip


LAUNCH_FLAGS: tuple[Flag, ...] = (
    ("--device", "device", str, "cpu or cuda (rank r on cuda:r)"),
    ("--backend", "backend", str, "gloo / nccl (default: by device)"),
    ("--threads", "threads_per_rank", integer, "torch threads per rank"),
    ("--timeout", "timeout_s", real, "seconds, any wait (default 300)"),
)
"""Where the ranks run: :class:`~nobubble.distributed.options.LaunchOptions`'s fields, checked
by it alone; the command line waits 300 s by default (the library 120), as it also profiles."""


def add_launch(p: argparse.ArgumentParser) -> None:
    """Where and how the ranks run: :data:`LAUNCH_FLAGS` and ``--clock``."""
    from nobubble.distributed.options import LaunchOptions

    add_config_flags(g := p.add_argument_group("launch"), LaunchOptions, LAUNCH_FLAGS)
    p.set_defaults(timeout_s=300.0)
    g.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="profile op times by wall clock or thread CPU time (cpu device)")  # fmt: skip


def check_launch(args: argparse.Namespace, ranks: int | None, model: ModelConfig | None):
    """The :class:`~nobubble.distributed.options.LaunchOptions` of the launch flags, checked
    by the options themselves and, after all that needs no torch, before any work:
    ``--device`` / ``--backend`` against this torch build, ``--threads`` against the cores
    (unless ``--force``), a built-in ``model``'s memory and time (None: a model of the user's
    own, or a profile's). What this machine has is
    :func:`~nobubble.distributed.check_device`'s (it imports torch)."""
    from nobubble.distributed import check_device_name
    from nobubble.distributed.options import LaunchOptions

    launch = apply_flags(LaunchOptions, flags_given(LAUNCH_FLAGS, args), LAUNCH_FLAGS)
    cores = os.cpu_count() or 1
    force = getattr(args, "force", False)
    if launch.threads_per_rank > cores and not force:
        raise UsageError(f"--threads {launch.threads_per_rank} is past this machine's {cores} "
                         f"cores; use at most {cores} (or --force)")  # fmt: skip
    check_device_name(launch.device, launch.backend)
    if model is not None:
        from nobubble.pipeline.runtime.models import memory_bytes

        data = memory_bytes(model, microbatch_size=args.microbatch_size, num_ranks=ranks or 1)
        check_budget("pp", processes=ranks or 1, data_bytes=data, force=force)
        tokens = args.microbatch_size * model.tokens_per_sample
        check_time(args, ranks or 1, model.num_parameters, tokens)
    return launch


TIME_BUDGET_S = 3600.0
"""The longest a ``pp profile | run`` may be estimated to take without ``--force``."""


def check_time(args: argparse.Namespace, ranks: int, params: int, tokens: int) -> None:
    """Refuse ``--steps`` (``pp run``) or ``--repeats`` (``pp profile``) whose estimated time
    (:func:`~nobubble.pipeline.runtime.models.train_seconds`,
    :func:`~nobubble.pipeline.runtime.models.profile_seconds`), for a model of ``params``
    parameters and ``tokens`` tokens (or rows) a microbatch, passes :data:`TIME_BUDGET_S`."""
    from nobubble.pipeline.runtime.models import profile_seconds, train_seconds

    if getattr(args, "steps", None) is not None:
        flag, value, what = "--steps", args.steps, "step"
        total = train_seconds(params, tokens, num_ranks=ranks, steps=args.steps,
                              num_microbatches=args.microbatches or 1)  # fmt: skip
    elif getattr(args, "repeats", None) is not None:
        flag, value, what = "--repeats", args.repeats, "repeat"
        total = profile_seconds(params, tokens, repeats=args.repeats)
    else:
        return
    check_steps("", flag, value, total / value, limit_s=TIME_BUDGET_S,
                limit=f"the budget of {TIME_BUDGET_S:,.0f} s", hint=", or a smaller model",
                bound="about", unit=what, force=getattr(args, "force", False))  # fmt: skip
