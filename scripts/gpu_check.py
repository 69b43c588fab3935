"""GPU readiness: every CUDA path that one device can exercise, as a pass/fail table.

    python scripts/gpu_check.py                  # on a machine with a CUDA device, < 5 min
    python scripts/gpu_check.py --dry-run        # list the checks and the skip list only
    python scripts/gpu_check.py --device cpu     # rehearse every check on CPU (gloo)
    python scripts/gpu_check.py --json out.json  # also write the table as JSON

Each check compares the device against an independent CPU computation (fp32, TF32 off):
the pipeline runner's gradients against one process, the FP8 casts against the CPU
kernels' bytes, the MoE layer against the token-by-token reference MoE, and the collectives
of a world of one (NCCL on CUDA) against their identity. Paths that need two or more GPUs are listed
as skipped, with the reason. Not part of ``make test`` (CI has no GPU); the test suite runs
``--dry-run`` and the CPU rehearsal, so the script itself stays runnable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from nobubble.distributed import spawn

TIMEOUT_S = 240.0  # per spawned check
SKIPPED = (
    ("pipeline P2P between GPUs", "NCCL send/recv needs 2 ranks on 2 devices"),
    ("EP dispatch / combine between GPUs", "the all-to-all of 2+ ranks needs 2+ devices"),
    ("hierarchical and low-latency EP modes", "intra/inter-node routing needs 2+ devices"),
    ("shared-memory transport", "a CPU-host transport; it has no CUDA path"),
    ("RL learner groups", "gradient all-reduce between learners needs 2+ devices"),
)


@dataclass(frozen=True)
class CheckResult:
    """One row of the table."""

    name: str
    status: str  # "pass" | "fail"
    seconds: float
    detail: str


def _close(name: str, got: torch.Tensor | None, want: torch.Tensor | None, tol: float) -> float:
    """The largest absolute difference; raises when it is past ``tol`` (or one is missing)."""
    if got is None or want is None:
        raise AssertionError(f"{name}: no gradient")
    err = float((got.detach().cpu().double() - want.detach().cpu().double()).abs().max())
    if not err <= tol:
        raise AssertionError(f"{name}: max |difference| {err:.3g} > {tol:g}")
    return err


# -- pipeline -------------------------------------------------------------------------------
def _stages() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32)),
        nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)),
    ]


def _fp32_only() -> None:
    """Each rank is a fresh interpreter: TF32 off there too, to compare fp32 with fp32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _pipeline_rank(ctx) -> str:
    from nobubble.pipeline import PipelineRunner, get_schedule

    _fp32_only()
    device = ctx.device
    x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 4
    reference = _stages()  # CPU, one process, the whole batch
    nn.functional.cross_entropy(reference[1](reference[0](x)), y).backward()
    worst = 0.0
    for name in ("1f1b", "zb-h1"):  # a world of one: the whole model is its one stage
        sched = get_schedule(name, num_ranks=1, num_microbatches=4)
        stages = [m.to(device) for m in _stages()]
        model = nn.Sequential(*stages)
        runner = PipelineRunner([model], sched, nn.functional.cross_entropy, timeout_s=60)
        _sync(device)
        start = time.perf_counter()
        runner.step(x.to(device), y.to(device))
        _sync(device)
        step_ms = 1e3 * (time.perf_counter() - start)
        for mine, ref in zip(stages, reference, strict=True):
            for p, q in zip(mine.parameters(), ref.parameters(), strict=True):
                assert p.grad is not None, f"{name}: a parameter got no gradient"
                worst = max(worst, _close(name, p.grad, q.grad, 1e-4))
        runner.close()
    return f"1f1b, zb-h1 gradients vs CPU: max diff {worst:.2g}; last step {step_ms:.1f} ms"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_pipeline_runner(device: str) -> str:
    return spawn(_pipeline_rank, 1, device=device, timeout_s=TIMEOUT_S)[0]


def check_profile_clock(device: str) -> str:
    """Stage profiles with a clock that waits for the device's kernels."""
    from nobubble.pipeline.runtime.profile import profile_modules

    stages = [m.to(device) for m in _stages()]
    x, y = torch.randn(8, 16).to(device), (torch.arange(8) % 4).to(device)
    prof = profile_modules(stages, x, y, nn.functional.cross_entropy, repeats=3, clock="wall")
    costs = prof.cost_model()
    if not all(t > 0 for t in (*costs.t_f, *costs.t_b, *costs.t_w)):
        raise AssertionError(f"non-positive op times {costs}")
    return f"T_F per stage {[round(t, 3) for t in costs.t_f]} ms"


# -- MoE ------------------------------------------------------------------------------------
def check_fp8_casts(device: str) -> str:
    """The device's e4m3 casts give the CPU kernels' bytes, and the same values back."""
    from nobubble.moe.fastpath.fp8 import dequantize_rows, quantize_rows

    x = torch.randn(64, 320, generator=torch.Generator().manual_seed(3)) * 3
    for dtype in (torch.float32, torch.bfloat16):
        cpu = quantize_rows(x.to(dtype))  # the C kernel where it covers the case
        dev = quantize_rows(x.to(dtype).to(device)).cpu()
        if not torch.equal(cpu, dev):
            bad = int((cpu != dev).any(dim=1).sum())
            raise AssertionError(f"{dtype}: {bad} of {cpu.shape[0]} packed rows differ")
        back_cpu = dequantize_rows(cpu, 320, dtype)
        back_dev = dequantize_rows(dev.to(device), 320, dtype).cpu()
        if not torch.equal(back_cpu, back_dev):
            raise AssertionError(f"{dtype}: dequantised values differ from the CPU kernel's")
    return "fp32 and bf16: packed bytes and dequantised values equal the CPU kernels'"


def _moe_rank(ctx) -> str:
    from nobubble.moe import Buffer, MoEConfig, MoELayer, ReferenceMoE, init_moe_weights

    _fp32_only()
    config = MoEConfig(hidden=32, expert_hidden=48, num_experts=4, topk=2)
    weights = init_moe_weights(config, seed=5)
    x = torch.randn(24, 32, generator=torch.Generator().manual_seed(6))
    reference = ReferenceMoE(config, weights)  # CPU, every expert, token by token
    x_ref = x.clone().requires_grad_(True)
    out_ref = reference(x_ref)
    out_ref.square().sum().backward()
    layer = MoELayer(config, weights, Buffer(num_experts=4, timeout_s=60)).to(ctx.device)
    x_dev = x.to(ctx.device).requires_grad_(True)
    out = layer(x_dev)
    out.square().sum().backward()
    errs = [
        _close("output", out, out_ref, 1e-4),
        _close("input grad", x_dev.grad, x_ref.grad, 1e-3),
    ]
    for name in ("w_gate", "w_up", "w_down"):
        errs.append(_close(name, getattr(layer, name).grad, getattr(reference, name).grad, 1e-3))
    return f"forward and backward vs the CPU reference MoE: max diff {max(errs):.2g}"


def check_moe_layer(device: str) -> str:
    return spawn(_moe_rank, 1, device=device, timeout_s=TIMEOUT_S)[0]


def _collectives_rank(ctx) -> str:
    import torch.distributed as dist

    from nobubble.moe.transport import TorchDistTransport

    transport = TorchDistTransport(timeout_s=60)
    rows = torch.randn(6, 8, device=ctx.device)
    moved = [
        transport.all_to_all(rows, [6], [6], kind="x"),
        transport.all_gather(rows, kind="x"),
        transport.reduce_scatter(rows, kind="x"),
    ]
    for got in moved:
        if not torch.equal(got, rows):
            raise AssertionError("a collective of a world of one changed its input")
    total = rows.clone()
    dist.all_reduce(total)
    if not torch.equal(total, rows):
        raise AssertionError("all_reduce of a world of one changed its input")
    return f"{ctx.backend}: all_to_all, all_gather, reduce_scatter, all_reduce"


def check_collectives(device: str) -> str:
    return spawn(_collectives_rank, 1, device=device, timeout_s=TIMEOUT_S)[0]


CHECKS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("pipeline runner on one device", check_pipeline_runner),
    ("stage profile, synchronised clock", check_profile_clock),
    ("FP8 casts against the CPU kernels", check_fp8_casts),
    ("MoE layer forward / backward", check_moe_layer),
    ("collectives of a world of one", check_collectives),
)


def run_checks(device: str) -> list[CheckResult]:
    """Every check on ``device``; a failure is recorded and the next check still runs."""
    _fp32_only()
    results = []
    for name, fn in CHECKS:
        start = time.perf_counter()
        try:
            detail, status = fn(device), "pass"
        except Exception as err:  # a failing check is a row of the table, not the end
            first = (str(err).splitlines() or [""])[0]
            detail, status = f"{type(err).__name__}: {first}", "fail"
        results.append(CheckResult(name, status, time.perf_counter() - start, detail))
        print(f"  {status:4}  {name} ({results[-1].seconds:.1f} s)", file=sys.stderr)
    return results


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a rehearsal)")
    ap.add_argument("--dry-run", action="store_true", help="list the checks, run nothing")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.device not in ("cuda", "cpu"):
        print(f"gpu_check: --device {args.device!r}; use cuda or cpu", file=sys.stderr)
        return 2
    if args.dry_run:
        rows = [[name, "would run"] for name, _ in CHECKS]
        rows += [[name, f"skipped: {why}"] for name, why in SKIPPED]
        print(_table(rows, ["check", "plan"]))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --dry-run, or --device cpu", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU rehearsal"
    print(f"gpu_check on {where}, torch {torch.__version__}", file=sys.stderr)
    results = run_checks(args.device)
    rows = [[r.name, r.status, f"{r.seconds:.1f}", r.detail] for r in results]
    rows += [[name, "skip", "-", why] for name, why in SKIPPED]
    print(_table(rows, ["check", "result", "s", "detail"]))
    if args.json is not None:
        payload = {"device": where, "torch": torch.__version__,
                   "results": [asdict(r) for r in results], "skipped": dict(SKIPPED)}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if all(r.status == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
