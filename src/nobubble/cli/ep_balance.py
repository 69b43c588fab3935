"""``nobubble ep balance``: place redundant experts for given or synthetic loads.

Prints the load of every GPU before (each expert once, in order, no redundancy) and after
:func:`~nobubble.moe.balance.eplb.rebalance_experts`, the imbalance (max / mean GPU load) of both,
DeepSeek's original EPLB on the same loads for comparison, and the placement. ``--plot``
draws the before / after loads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nobubble.cli.util import (
    UsageError,
    add_json_flag,
    input_file,
    nonneg_int,
    plot_file,
    positive_int,
    print_json,
    print_table,
)
from nobubble.files import save_figure
from nobubble.validation import MAX_REAL, finite

__all__ = ["register", "synthetic_loads", "parse_skew"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``balance`` to the ``ep`` group's sub-command parsers ``sub``."""
    p = sub.add_parser(
        "balance",
        help="place redundant experts (EPLB) and show per-GPU load before / after",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--experts", type=positive_int, required=True, help="logical experts E")
    p.add_argument("--gpus", type=positive_int, required=True, help="GPUs G (multiple of --nodes)")
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes N (default 1)")
    p.add_argument(
        "--redundant", type=nonneg_int, default=0, help="redundant experts: E + R must divide by G"
    )
    p.add_argument("--groups", type=positive_int, default=1, help="expert groups (default 1)")
    p.add_argument(
        "--policy", choices=("auto", "hierarchical", "global"), default="auto", help="EPLB policy"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--skew",
        default="zipf:1.0",
        help="synthetic loads: zipf:S (load ~ 1/rank^S) or pareto:A (Pareto tail index A)",
    )
    src.add_argument(
        "--weights",
        type=input_file,
        help="loads file: JSON list (or list of lists, one per layer) "
        "or text with one whitespace/comma separated row per layer",
    )
    p.add_argument("--layers", type=positive_int, default=1, help="synthetic layers (default 1)")
    p.add_argument("--tokens", type=positive_int, default=100_000, help="synthetic tokens/layer")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed for synthetic loads")
    p.add_argument("--plot", type=plot_file, help="draw per-GPU loads before / after (PNG or SVG)")
    p.add_argument(
        "--force", action="store_true", help="place more layer x expert slots than the budget"
    )
    add_json_flag(p)
    p.set_defaults(func=_balance, parser=p)


def parse_skew(text: str) -> tuple[str, float]:
    """``"zipf:1.2"`` -> ``("zipf", 1.2)``; ValueError naming the accepted forms."""
    kind, _, value = text.partition(":")
    try:
        param = float(value)
    except ValueError:
        param = float("nan")
    if kind not in ("zipf", "pareto") or not (finite(param) and param > 0):
        raise ValueError(f"--skew {text!r}: use zipf:S or pareto:A with a finite number > 0")
    return kind, param


def synthetic_loads(
    kind: str, param: float, num_layers: int, num_experts: int, tokens: int, seed: int
):
    """(L, E) float64 heavy-tailed loads summing to ``tokens`` per layer, experts shuffled.

    zipf: the k-th most popular expert gets ``1 / k**param``; pareto: i.i.d. Pareto(param)
    popularities (scale 1, ``numpy.random.pareto(param) + 1``).
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_layers):
        if kind == "zipf":
            with np.errstate(over="ignore"):  # a huge skew: every rank past the first is 0
                pop = rng.permutation(1.0 / np.arange(1, num_experts + 1) ** param)
        else:
            pop = rng.pareto(param, num_experts) + 1.0
        rows.append(pop / pop.sum() * tokens)
    return torch.tensor(np.stack(rows), dtype=torch.float64)


def _read_weights(path: Path):
    """(L, E) float64 loads from ``path``: JSON (a list, or a list of lists) or text rows."""
    import torch

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--weights {path}: cannot read ({err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [
                [float(x) for x in line.replace(",", " ").split()]
                for line in text.splitlines()
                if line.strip()
            ]
        except ValueError as err:
            raise ValueError(
                f"--weights {path}: not JSON, and a row is not numbers ({err})"
            ) from None
    if not isinstance(data, list):
        raise ValueError(f"--weights {path}: give a JSON list of loads (or a list of lists, one "
                         f"per layer), not a {type(data).__name__}")  # fmt: skip
    if data and not isinstance(data[0], list):
        data = [data]
    try:
        weight = torch.tensor(data, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"--weights {path}: rows must be numbers of equal length ({err})"
        ) from None
    if weight.numel() == 0:
        raise ValueError(f"--weights {path}: no numbers; give one row of expert loads per layer")
    if not (weight.isfinite().all() and weight.abs().max() <= MAX_REAL):
        raise ValueError(f"--weights {path}: a load is not a finite number (NaN, inf, 1e308)")
    if (weight < 0).any():
        raise ValueError(f"--weights {path}: a load is negative; loads count tokens, >= 0")
    if not weight.sum(-1).gt(0).all():
        raise ValueError(f"--weights {path}: a row's loads are all zero; nothing to balance")
    return weight


MAX_SLOTS = 10_000_000
"""Most layers x physical experts one run places: EPLB's packing is a Python loop over them
(about a microsecond each), and the report holds every slot."""


def _check_problem(args: argparse.Namespace) -> None:
    """Refuse, before any loads are made, a placement EPLB cannot do (its own ValueError), a
    flag the chosen load source ignores, and a problem past :data:`MAX_SLOTS`."""
    from nobubble.moe.balance.eplb import check_config

    check_config(args.experts, args.experts + args.redundant, args.groups, args.nodes,
                 args.gpus, args.policy)  # fmt: skip
    if args.weights is not None:
        for flag in ("layers", "tokens", "seed"):
            if getattr(args, flag) != args.parser.get_default(flag):
                raise UsageError(f"--{flag} shapes synthetic loads; --weights gives the loads, "
                                 f"drop --{flag}")  # fmt: skip
        return
    if not finite(args.tokens):
        raise UsageError(f"--tokens {args.tokens}: past {MAX_REAL:g}, not a count of tokens")
    slots = args.layers * (args.experts + args.redundant)
    if slots > MAX_SLOTS and not args.force:
        raise UsageError(
            f"ep balance: --layers {args.layers:,} x {args.experts + args.redundant:,} physical "
            f"experts = {slots:,} placements, past the budget of {MAX_SLOTS:,}; use fewer, or "
            "--force"
        )


def _balance(args: argparse.Namespace) -> int:
    from nobubble.moe.balance.eplb import gpu_loads, rebalance_experts
    from nobubble.moe.balance.eplb_reference import reference_rebalance_experts

    _check_problem(args)
    if args.weights is not None:
        weight = _read_weights(args.weights)
        if weight.shape[1] != args.experts:
            raise ValueError(
                f"--weights has {weight.shape[1]} experts per row, --experts is {args.experts}"
            )
    else:
        kind, param = parse_skew(args.skew)
        weight = synthetic_loads(kind, param, args.layers, args.experts, args.tokens, args.seed)
    num_replicas = args.experts + args.redundant
    placement = rebalance_experts(
        weight, num_replicas, args.groups, args.nodes, args.gpus, policy=args.policy
    )
    before = _static_loads(weight, args.gpus)  # (L, G)
    after = placement.gpu_loads(weight)  # (L, G)
    # DeepSeek's original on the same loads and policy (its global policy is one group, one node)
    hier = placement.policy == "hierarchical"
    ref_phy2log, _, _ = reference_rebalance_experts(
        weight, num_replicas, args.groups if hier else 1, args.nodes if hier else 1, args.gpus
    )
    ref = (gpu_loads(weight, ref_phy2log, args.gpus), _duplicates(ref_phy2log, args.gpus))
    report = _report(args, placement, before, after, ref)
    if args.plot is not None:
        _plot(args.plot, before[0], after[0], placement, report["imbalance"][0])
        report["plot"] = str(args.plot)
    if args.json:
        print_json(report)
    else:
        _print(report)
    return 0


def _static_loads(weight, num_gpus: int):
    """(L, G): experts in order, spread as evenly as possible, one copy each."""
    import torch

    num_layers, num_experts = weight.shape
    gpu_of = torch.arange(num_experts) * num_gpus // num_experts  # (E,)
    out = torch.zeros(num_layers, num_gpus, dtype=torch.float64)
    out.index_add_(1, gpu_of, weight.double())
    return out


def _duplicates(phy2log, num_gpus: int):
    srt = phy2log.view(phy2log.shape[0], num_gpus, -1).sort(-1).values
    return (srt[..., 1:] == srt[..., :-1]).any(-1).sum(-1)


def _imb(loads):
    return (loads.max(-1).values / loads.mean(-1)).tolist()


def _report(args, placement, before, after, ref) -> dict:
    per_gpu = placement.phy2log.view(placement.num_layers, args.gpus, -1)  # (L, G, R/G)
    return {
        "experts": args.experts,
        "gpus": args.gpus,
        "nodes": args.nodes,
        "groups": args.groups,
        "redundant": args.redundant,
        "policy": placement.policy,
        "imbalance_before": _imb(before),
        "imbalance": _imb(after),
        "duplicate_gpus": placement.duplicate_gpus().tolist(),
        "eplb_original_imbalance": _imb(ref[0]),
        "eplb_original_duplicate_gpus": ref[1].tolist(),
        "gpu_load_before": before.tolist(),
        "gpu_load_after": after.tolist(),
        "phy2log": placement.phy2log.tolist(),
        "gpu_experts": per_gpu.tolist(),
        "logcnt": placement.logcnt.tolist(),
    }


def _print(report: dict) -> None:
    gpn = report["gpus"] // report["nodes"]
    rows = []
    counts = report["logcnt"][0]
    for g, experts in enumerate(report["gpu_experts"][0]):
        names = " ".join(f"{e}" + ("*" if counts[e] > 1 else "") for e in experts)
        rows.append(
            [g, g // gpn, report["gpu_load_before"][0][g], report["gpu_load_after"][0][g], names]
        )
    print_table(
        f"layer 0: {report['experts']} experts + {report['redundant']} redundant on "
        f"{report['gpus']} GPUs / {report['nodes']} nodes ({report['policy']})",
        ["gpu", "node", "load before", "load after", "experts (* = replicated)"],
        rows,
    )
    summary = []
    for layer, (b, a) in enumerate(zip(report["imbalance_before"], report["imbalance"])):
        summary.append(
            [
                layer,
                b,
                a,
                report["duplicate_gpus"][layer],
                report["eplb_original_imbalance"][layer],
                report["eplb_original_duplicate_gpus"][layer],
            ]
        )
    cols = ["layer", "max/mean before", "max/mean after", "GPUs with an expert twice"]
    cols += ["EPLB original max/mean", "EPLB: GPUs with an expert twice"]
    print_table("imbalance (max / mean GPU load)", cols, summary)


def _plot(path: Path, before, after, placement, imbalance: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_gpus = len(before)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, num_gpus * 0.35 + 4), 3.5), sharey=True)
    for ax, loads, title in (
        (axes[0], before, f"before: max/mean {float(before.max() / before.mean()):.3f}"),
        (axes[1], after, f"after EPLB: max/mean {imbalance:.3f}"),
    ):
        ax.bar(range(num_gpus), loads.tolist(), color="#4c72b0")
        ax.axhline(float(loads.mean()), color="#c44e52", lw=1, ls="--", label="mean")
        ax.set_title(title)
        ax.set_xlabel("GPU")
    axes[0].set_ylabel("tokens (layer 0)")
    axes[0].legend()
    fig.suptitle(
        f"{placement.num_replicas} physical experts on {num_gpus} GPUs ({placement.policy})"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    plt.close(fig)
