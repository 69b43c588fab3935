"""The optimizer step without its wait: post-validation as a hook of the pipeline runner.

    python examples/pp_post_validation.py [--steps 6] [--max-norm 1.0]

Two ranks train the same small model twice with ZB-H1, side by side: once with the
synchronous step (all-reduce the gradient norm, wait, clip, step) and once with
``PostValidatedOptimizer`` as a runner hook (step at once; the runner confirms when the next
step starts, rolling back and redoing the step when clipping was needed). It prints what
each step did and whether the two runs' weights are equal bit for bit after it.
"""

import argparse

import torch
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, get_schedule, split_model
from nobubble.pipeline.runtime.optim import PostValidatedOptimizer, synchronous_step


def stages(num_stages: int) -> list[nn.Module]:
    torch.manual_seed(0)  # both runs start from the same weights
    blocks = [nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(4)]
    return split_model([*blocks, nn.Linear(32, 1)], num_stages)


def own_params(runner: PipelineRunner) -> list[nn.Parameter]:
    return [p for m in runner.stage_modules.values() for p in m.parameters()]


def train(ctx, steps: int, max_norm: float) -> list[str]:
    schedule = get_schedule("zb-h1", num_ranks=ctx.world_size, num_microbatches=4)
    loss_fn = nn.functional.mse_loss
    sync = PipelineRunner(stages(schedule.num_stages), schedule, loss_fn)
    sync_opt = torch.optim.AdamW(own_params(sync), lr=1e-2)
    mine = stages(schedule.num_stages)
    params = [p for s in schedule.stages_of(ctx.rank) for p in mine[s].parameters()]
    post = PostValidatedOptimizer(torch.optim.AdamW(params, lr=1e-2), params, max_norm=max_norm)
    runner = PipelineRunner(mine, schedule, loss_fn, hooks=[post])

    def line(step: int, done, result) -> str:
        equal = all(torch.equal(a, b) for a, b in zip(own_params(sync), params, strict=True))
        return (f"step {step}: norm {done.grad_norm:.2f}, synchronous {done.action}, "
                f"post-validated {result.action}, weights equal: {equal}")  # fmt: skip

    data = torch.Generator().manual_seed(1)
    lines, done = [], None
    for step in range(steps):
        x = torch.randn(16, 32, generator=data) * (1 + step)  # later steps need clipping
        y = x[:, :1].sin()
        runner.step(x, y)  # the hook confirms the previous post.step() before the forward
        if done is not None:
            lines.append(line(step - 1, done, post.last))
        sync.step(x, y)
        done = synchronous_step(sync_opt, own_params(sync), max_norm=max_norm)
        sync_opt.zero_grad(set_to_none=True)
        post.step()  # steps at once; the global check travels meanwhile
    lines.append(line(steps - 1, done, post.confirm()))  # the last one by hand
    runner.close()
    sync.close()
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--max-norm", type=float, default=1.0)
    args = ap.parse_args()
    print("\n".join(spawn(train, 2, args=(args.steps, args.max_norm))[0]))
