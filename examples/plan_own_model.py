"""Plan a pipeline for your own model, then run the plan: ``python examples/plan_own_model.py``.

The model is torch's own modules as a list of blocks (one tensor in, one out). This process
profiles each block once and chooses the cut, schedule, microbatch count and recompute; the
two gloo ranks each build the same model and run the plan, read back from its JSON.
"""

import torch
from torch import nn

from nobubble.distributed import spawn
from nobubble.pipeline import PipelineRunner, split_model
from nobubble.pipeline.plan import Plan
from nobubble.pipeline.runtime.planning import plan

VOCAB, HIDDEN, SEQ, BATCH = 256, 64, 32, 16


def model() -> list[nn.Module]:
    torch.manual_seed(0)  # every rank builds the same weights
    layers = [nn.TransformerEncoderLayer(HIDDEN, 4, 4 * HIDDEN, dropout=0.0, batch_first=True)
              for _ in range(4)]  # fmt: skip
    return [nn.Embedding(VOCAB, HIDDEN), *layers, nn.Linear(HIDDEN, VOCAB)]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def rank_main(ctx, plan_json: str, ids: torch.Tensor) -> float:
    p = Plan.from_json(plan_json)
    stages = split_model(model(), p.num_stages, balance=p)  # the plan's cut of this copy
    runner = PipelineRunner(stages, p.schedule(), loss_fn, recompute=p.recompute[0])
    loss = float(runner.step(ids[:, :-1], ids[:, 1:]))  # the mean loss, on every rank
    runner.close()
    return loss


if __name__ == "__main__":
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    p = plan(model(), ids[:, :-1], ids[:, 1:], loss_fn, num_ranks=2)
    print(f"plan: cuts {p.cuts}, {p.schedule_name}, {p.num_microbatches} microbatches, recompute "
          f"{p.recompute[0]}, predicted step {p.predicted_step_ms:.1f} ms")  # fmt: skip
    loss = spawn(rank_main, 2, args=(p.to_json(), ids))[0]
    print(f"ran the plan on 2 ranks: loss {loss:.3f}")
