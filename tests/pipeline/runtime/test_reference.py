"""reference_step: one process, every stage, the mean microbatch loss, one backward, on a
copy of the user's modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nobubble.pipeline.reference import reference_step
from tests.pipeline.runtime.torch_model import batch, loss_fn, stages


def test_the_reference_is_the_plain_backward_of_the_mean_loss() -> None:
    x, y = batch(8, 6)
    xs, ys = list(x.chunk(4)), list(y.chunk(4))
    loss, grads = reference_step(stages(2), xs, ys, loss_fn)
    mods = stages(2)  # the same weights: every block is built from one seed
    model = nn.Sequential(*mods)
    expected = sum(loss_fn(model(a), b) for a, b in zip(xs, ys)) / 4
    expected.backward()
    assert loss == float(expected.detach())
    names = {f"{s}.{n}": p for s, m in enumerate(mods) for n, p in m.named_parameters()}
    assert set(grads) == set(names)
    for key, p in names.items():
        torch.testing.assert_close(grads[key], p.grad, rtol=0, atol=0, msg=key)


def test_the_users_modules_are_neither_read_for_grads_nor_changed() -> None:
    x, y = batch(4, 5)
    mods = stages(2)
    for p in mods[0].parameters():
        p.grad = torch.full_like(p, 7.0)  # left over from the user's last step
    before = [p.detach().clone() for m in mods for p in m.parameters()]
    _, grads = reference_step(mods, [x], [y], loss_fn)
    _, clean = reference_step(stages(2), [x], [y], loss_fn)
    for key, grad in clean.items():
        torch.testing.assert_close(grads[key], grad, rtol=0, atol=0, msg=key)
    after = [p.detach() for m in mods for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(p.grad is None for p in mods[1].parameters())
    assert all(bool((p.grad == 7.0).all()) for p in mods[0].parameters())


def test_a_parameter_the_loss_does_not_reach_has_no_entry() -> None:
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    _, grads = reference_step([Unused()], [x], [y], nn.functional.mse_loss)
    assert set(grads) == {"0.used.weight", "0.used.bias"}


def test_one_target_per_input_is_required() -> None:
    x, y = batch(4, 5)
    with pytest.raises(ValueError, match="2 input and 1 target microbatches"):
        reference_step(stages(2), [x, x], [y], loss_fn)
