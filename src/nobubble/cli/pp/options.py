"""The ``pp`` commands' shared flags as :func:`~nobubble.cli.flags.add_args` tables (size,
schedule, per-rank costs in units of M_F, dispatch, model, launch) and their checks before
any work; ``pp profile | plan | run``'s own rows."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nobubble import budget
from nobubble.cli.flags import (
    Flag,
    add_args,
    add_config_flags,
    apply_flags,
    config_flags,
    config_from_flags,
    flags_given,
    integer,
    real,
)
from nobubble.cli.util import (
    UsageError,
    nonneg_float,
    positive_float,
    positive_int,
    seed_int,
)
from nobubble.imports import is_import_path, load_user_object
from nobubble.pipeline.costs import PAPER_TIMES
from nobubble.pipeline.plan_inputs import BUILTIN_MODELS
from nobubble.pipeline.runtime.models import GPTConfig, MLPConfig, ModelConfig, memory_bytes

if TYPE_CHECKING:
    from nobubble.pipeline.runtime.planning.train import UserModel
    from nobubble.pipeline.setting import PipelineSetting

# nobubble.pipeline.dispatch.DISPATCH_POLICIES, spelt out so that building the parser
# imports no pipeline code (a test keeps the two equal)
DISPATCH_CHOICES = ("static", "handshake")


def rank_costs(text: str) -> tuple[float, ...]:
    """argparse type: a positive number, or comma-separated positive numbers (one per rank)."""
    return tuple(positive_float(part) for part in text.split(","))


STRAGGLER = "RANK:FACTOR[:STEPS]"


def straggler_arg(text: str):
    """argparse type: ``RANK:FACTOR[:STEPS]`` as a Straggler."""
    from nobubble.pipeline.dispatch.perturb import parse_straggler

    try:
        return parse_straggler(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# the shared flags: (argument group title or None, add_args rows); a command changes a
# default with its own set_defaults
SIZE = (None, (
    ("--ranks -p", positive_int, 4, "pipeline ranks P"),
    ("--microbatches -m", positive_int, 8, "microbatches M"),
    ("--force", bool, False, "run sizes past the work budget (they may take minutes or GBs)"),
))  # fmt: skip
SCHEDULE = (None, (("--schedule -s", str, "zb-h1", "schedule name (default zb-h1)"),))
CHUNKS = (None, (("--chunks -v", positive_int, None, "chunks per rank V (default 2)"),))
TIMES = ("costs (per rank; default 1, 1, 1, 0 or --model's)", (
    ("--model", tuple(sorted(PAPER_TIMES)), None, "the paper's measured costs"),
    ("--tf", rank_costs, None, "forward time: one, or one per rank (20,18,18,24)", {"dest": "t_f"}),
    ("--tb", rank_costs, None, "input-gradient backward (B) time (or list)", {"dest": "t_b"}),
    ("--tw", rank_costs, None, "weight-gradient backward (W) time (or list)", {"dest": "t_w"}),
    ("--tcomm", nonneg_float, None, "transfer time between ranks", {"dest": "t_comm"}),
))  # fmt: skip
MEMORY = ("memory per microbatch (default: --model's, else the 1.5B shape)", (
    ("--hidden", positive_int, None, "hidden size h (M_F = 34h + 5as)"),
    ("--heads", positive_int, None, "attention heads a"),
    ("--seq", positive_int, None, "sequence length s"),
    ("--mem-f", positive_float, None, "activation memory an F stores", {"dest": "mem_f"}),
    ("--mem-b", nonneg_float, None, "memory a B frees", {"dest": "mem_b"}),
    ("--mem-w", nonneg_float, None, "memory a W frees", {"dest": "mem_w"}),
))  # fmt: skip
SHAPE = (SCHEDULE, SIZE, CHUNKS)
COSTS = (TIMES, MEMORY)


def flag_dests(table: tuple[str | None, tuple[tuple, ...]]) -> tuple[tuple[str, str], ...]:
    """``(flag, attribute)`` of each row of an :func:`~nobubble.cli.flags.add_args` table: the
    row's ``dest``, else argparse's (the first name without dashes, ``-`` as ``_``)."""
    flags = [(row[0].split()[0], row[4] if len(row) > 4 else {}) for row in table[1]]
    return tuple((f, extra.get("dest", f.lstrip("-").replace("-", "_"))) for f, extra in flags)


TIME_FLAGS = flag_dests(TIMES)
COST_FLAGS = TIME_FLAGS + flag_dests(MEMORY)
"""Every cost flag as ``(flag, attribute)``; the attributes are the ``costs`` keywords of
:meth:`~nobubble.pipeline.costs.CostModel.from_settings`."""


def mem_limit(text: str) -> tuple[None, tuple]:
    """The ``--mem-limit`` table with the help ``text``."""
    return (None, (("--mem-limit", positive_float, None, text),))


MEM_LIMIT = mem_limit("zb-1p/zb-2p/handshake activation limit per rank, units of M_F")
DISPATCH: tuple[str, tuple[tuple, ...]] = ("dispatch policy and perturbations", (
    ("--dispatch", DISPATCH_CHOICES, None, "static (default): walk the schedule's order; "
     "handshake: pick each op from what has arrived, within --mem-limit (default: its peak)"),
    ("--jitter", nonneg_float, 0.0, "op times times seeded [1-J, 1+J] factors", {"metavar": "J"}),
    ("--straggler", straggler_arg, [], "slow RANK's ops by FACTOR (1:1.5) in STEPS: N (the "
     "first N), A-B or A- (default all); repeatable", {"action": "append", "metavar": STRAGGLER}),
    ("--seed", seed_int, None, "seed of the jitter draws (default 0)"),
))  # fmt: skip


def setting(args: argparse.Namespace) -> PipelineSetting:
    """The :class:`~nobubble.pipeline.setting.PipelineSetting` of the size, schedule, cost and
    ``--mem-limit`` flags as they stand (a command may first take a size from a file)."""
    from nobubble.pipeline.setting import PipelineSetting

    costs = {name: getattr(args, name, None) for _, name in COST_FLAGS}
    return PipelineSetting(args.ranks, args.microbatches, getattr(args, "schedule", None),
                           getattr(args, "chunks", None), mem_limit=getattr(args, "mem_limit", None),
                           force=args.force, costs=costs)  # fmt: skip


def read_file(path: Path, flag: str, kind: str = "schedule") -> Any:
    """The schedule CSV or (``kind``) the torch-free profile or plan JSON at ``path``; a file
    that is none is one line naming ``flag`` (how the user gave it)."""
    from nobubble.pipeline.actions import Schedule
    from nobubble.pipeline.plan import Plan
    from nobubble.pipeline.runtime.profile_data import Profile

    readers: dict[str, Any] = {"profile": Profile.read, "plan": Plan.read}
    try:
        return readers.get(kind, Schedule.read_csv)(path)
    except ValueError as err:
        raise UsageError(f"{flag} {err}".strip()) from None


def refuse(*cases: tuple[object, str]) -> None:
    """A UsageError of the first ``(condition, message)`` whose condition holds."""
    if message := next((message for bad, message in cases if bad), None):
        raise UsageError(message)


def file_sets_size(args: argparse.Namespace, source: str, num_ranks: int,
                   num_microbatches: int | None = None, held: str = "has") -> None:  # fmt: skip
    """Refuse ``--ranks`` / ``-m`` that disagree with the file ``source`` (flag and path;
    ``held``: how it holds its ranks) that sets them (``num_microbatches`` None: it sets no
    microbatch count), then take its microbatches."""
    sets_m = num_microbatches is not None
    refuse(
        (args.ranks not in (None, num_ranks), f"{source} {held} {num_ranks} ranks but --ranks "
         f"is {args.ranks}; give --ranks {num_ranks}"),
        (sets_m and args.microbatches not in (None, num_microbatches), f"-m {args.microbatches}, "
         f"but {source} runs {num_microbatches} microbatches; drop -m (the file sets it)"),
    )  # fmt: skip
    if sets_m:
        args.microbatches = num_microbatches


def perturbation_from_args(args: argparse.Namespace):
    """The Perturbation of ``--jitter/--straggler/--seed``."""
    from nobubble.pipeline.dispatch.perturb import Perturbation

    refuse((args.seed is not None and not args.jitter, f"--seed {args.seed} seeds the --jitter "
            "draws, and there are none; add --jitter J or drop --seed"))  # fmt: skip
    return Perturbation(jitter=args.jitter, stragglers=tuple(args.straggler), seed=args.seed or 0)


MODEL_FLAGS = config_flags(
    GPTConfig, "--layers=num_layers hidden --heads=num_heads seq_len --vocab=vocab_size"
)
"""GPTConfig's size fields (MLPConfig has the first two)."""
RUN_DEFAULTS = {"arch": "gpt", "microbatch_size": 2, "seed": 0}  # the other model flags'
LAUNCH_FLAGS: tuple[Flag, ...] = (
    ("--device", "device", str, "cpu or cuda (rank r on cuda:r)"),
    ("--backend", "backend", str, "gloo / nccl (default: by device)"),
    ("--threads", "threads_per_rank", integer, "torch threads per rank"),
    ("--timeout", "timeout_s", real, "seconds, any wait (default 300)"),
)
"""LaunchOptions' fields, checked by it alone; the command line waits 300 s (the library 120)."""


def add_model_and_launch(p: argparse.ArgumentParser) -> None:
    """The model flags (``--model`` and the built-in model's size) and the launch flags."""
    from nobubble.distributed.options import LaunchOptions

    g = p.add_argument_group("model")
    add_args(g, (("--model", str, None, "a built-in model, or a factory returning (blocks, "
                  "inputs, targets, loss_fn): package.module:factory or path/to/file.py:factory",
                  {"metavar": "gpt|mlp|MODULE:FACTORY"}),
                 ("--arch", BUILTIN_MODELS, None, "built-in model (default gpt)")))  # fmt: skip
    add_config_flags(g, GPTConfig, MODEL_FLAGS)
    add_args(g, (("--microbatch-size", positive_int, None, "samples per mb (default 2)"),
                 ("--seed", seed_int, None, "weights, data and factory seed (default 0)")))  # fmt: skip
    add_config_flags(g := p.add_argument_group("launch"), LaunchOptions, LAUNCH_FLAGS)
    add_args(g, (("--clock", ("wall", "cpu"), "wall", "profile op times by wall clock or "
                  "thread CPU time (cpu device)"),))  # fmt: skip
    p.set_defaults(timeout_s=300.0, **RUN_DEFAULTS)


def model_from_args(args: argparse.Namespace) -> ModelConfig:
    """The built-in model of ``--model gpt|mlp`` (else ``--arch``) and its size flags, checked
    by the config itself (torch-free); callers take ``--model MODULE:FACTORY`` elsewhere."""
    gpt = (args.model or args.arch) == "gpt"
    return config_from_flags(GPTConfig if gpt else MLPConfig, MODEL_FLAGS, args, seed=args.seed)


def load_user_model(spec: str, *, seed: int) -> UserModel:
    """:meth:`UserModel.from_factory <nobubble.pipeline.runtime.planning.UserModel.from_factory>`
    of the factory ``spec``, seeded with ``seed``; a bad spec or factory: UsageError."""
    from nobubble.pipeline.runtime.planning.train import UserModel

    refuse((not is_import_path(spec), f"--model {spec!r}: give {' or '.join(BUILTIN_MODELS)}, "
            "or your own model's factory as package.module:factory or path/to/file.py:factory"))  # fmt: skip
    factory = load_user_object("--model", spec, "--model")
    try:
        return UserModel.from_factory(factory, seed=seed)
    except ValueError as err:
        raise UsageError(f"--model {spec!r}: {err}") from err


def given_model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags given (``--arch``, ``--microbatch-size``, ``--seed``: not default)."""
    given = [flag for flag, field, _, _ in MODEL_FLAGS if getattr(args, field) is not None]
    given += [f"--{dest.replace('_', '-')}" for dest, default in RUN_DEFAULTS.items()
              if getattr(args, dest) != default]  # fmt: skip
    return (["--model"] if args.model is not None else []) + given


def check_factory_flags(args: argparse.Namespace) -> None:
    """Refuse the built-in model's flags (all but ``--seed``) beside ``--model MODULE:FACTORY``."""
    odd = [f for f in given_model_flags(args) if f not in ("--model", "--seed")]
    refuse((odd, f"{', '.join(odd)}: the built-in models' flags; --model {args.model} builds "
            "its own model, drop them"))  # fmt: skip


def check_launch(args: argparse.Namespace, ranks: int | None, model: ModelConfig | None):
    """The :class:`~nobubble.distributed.options.LaunchOptions` of the launch flags, checked
    before any work and without torch against this torch build, the cores (unless
    ``--force``) and a built-in ``model``'s memory and time (None: a user's or profile's)."""
    from nobubble.distributed import check_device_name
    from nobubble.distributed.options import LaunchOptions

    launch = apply_flags(LaunchOptions, flags_given(LAUNCH_FLAGS, args), LAUNCH_FLAGS)
    cores = os.cpu_count() or 1
    refuse((launch.threads_per_rank > cores and not args.force, f"--threads "
            f"{launch.threads_per_rank} is past this machine's {cores} cores; use at most "
            f"{cores} (or --force)"))  # fmt: skip
    check_device_name(launch.device, launch.backend)
    if model is not None:
        data = memory_bytes(model, microbatch_size=args.microbatch_size, num_ranks=ranks or 1)
        budget.check_budget("pp", processes=ranks or 1, data_bytes=data, force=args.force)
        tokens = args.microbatch_size * model.tokens_per_sample
        check_estimated_time(args, ranks or 1, model.num_parameters, tokens)
    return launch


def check_estimated_time(args: argparse.Namespace, ranks: int, params: int, tokens: int) -> None:
    """Refuse ``--steps`` (or ``--repeats``) whose time, estimated for a model of ``params``
    parameters and ``tokens`` tokens (or rows) a microbatch, passes the time budget
    (:func:`nobubble.budget.check_time` of the estimate)."""
    from nobubble.pipeline.runtime.models import profile_seconds, train_seconds

    if getattr(args, "steps", None) is not None:
        total = train_seconds(params, tokens, num_ranks=ranks, steps=args.steps,
                              num_microbatches=args.microbatches or 1)  # fmt: skip
        budget.check_time("--steps", args.steps, total, "step", force=args.force)
    elif getattr(args, "repeats", None) is not None:
        total = profile_seconds(params, tokens, repeats=args.repeats)
        budget.check_time("--repeats", args.repeats, total, "repeat", force=args.force)
