"""Moving layers between ranks at a step boundary: their weights, buffers and optimizer state.

Every rank holds a replica of every layer (the user builds the whole model on each rank, as
with :func:`~nobubble.pipeline.runtime.runner.split_model`), but only a layer's owner trains
it; the replica elsewhere goes stale. When a re-plan gives layer ``i`` a new owner, the old
owner sends the layer's ``state_dict`` tensors (parameters and buffers, copied in place into
the new owner's replica, so the module objects stay the same) and the optimizer state of
each of its parameters (momentum, Adam's moments and step).

The transfers are point-to-point, in layer order on every rank. That cannot deadlock: the
first transfer not yet done has both its ranks past every earlier transfer (each of those is
done), so both are at it, and it completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.pipeline.runtime.channel import global_rank

__all__ = ["owners", "move_layers"]


def owners(sizes: Sequence[int]) -> list[int]:
    """The rank that holds each layer under the contiguous cut ``sizes``."""
    return [r for r, size in enumerate(sizes) for _ in range(size)]


def move_layers(
    layers: Sequence[nn.Module],
    old_sizes: Sequence[int],
    new_sizes: Sequence[int],
    optimizer_state: dict[nn.Parameter, dict[str, Any]],
    *,
    rank: int,
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> dict[nn.Parameter, dict[str, Any]]:
    """Hand every layer whose owner changes from ``old_sizes`` to ``new_sizes`` to its new
    owner (a collective: every rank of ``group`` calls it with the same sizes).

    ``optimizer_state`` maps this rank's parameters to their optimizer state (a dict of
    tensors and numbers, as ``torch.optim.Optimizer.state``); the returned map holds the state
    of every parameter this rank owns afterwards: kept for layers that stayed, received for
    layers that came in. Gradients do not move: call it after the optimizer step. A layer
    without parameters or buffers (an activation) moves without a message. ``device``: where
    the optimizer state travels through (the process group's device; default: the layer's).
    """
    before, after = owners(old_sizes), owners(new_sizes)
    if len(before) != len(layers) or len(after) != len(layers):
        raise ValueError(f"move_layers: cuts {list(old_sizes)} -> {list(new_sizes)} do not "
                         f"cover the {len(layers)} layers; give layer counts per rank that "
                         f"sum to {len(layers)}")  # fmt: skip
    kept = {p: s for p, s in optimizer_state.items()}
    for i, layer in enumerate(layers):
        src, dst = before[i], after[i]
        if src == dst or rank not in (src, dst):
            continue
        params = list(layer.parameters())
        tensors = list(layer.state_dict(keep_vars=False).values())
        if not params and not tensors:  # both ranks know: nothing to send
            continue
        via = device if device is not None else _device(layer)
        if rank == src:
            peer = global_rank(group, dst)
            for t in tensors:
                dist.send(t.detach().contiguous(), peer, group=group)
            states = [_portable(kept.pop(p, {})) for p in params]
            dist.send_object_list([states], dst=peer, group=group, device=via)
        else:
            peer = global_rank(group, src)
            with torch.no_grad():
                for t in tensors:
                    buf = torch.empty_like(t, memory_format=torch.contiguous_format)
                    dist.recv(buf, peer, group=group)
                    t.copy_(buf)
            box: list[Any] = [None]
            dist.recv_object_list(box, src=peer, group=group, device=via)
            for p, state in zip(params, box[0], strict=True):
                if state:
                    kept[p] = _placed(state, p.device)
    return kept


def _portable(state: dict[str, Any]) -> dict[str, Any]:
    """The state with its tensors on the CPU, each tagged with whether it lived on the
    parameter's device (Adam keeps ``step`` on the CPU while its moments sit on the GPU)."""
    return {k: (v.detach().cpu(), v.device.type != "cpu") if isinstance(v, torch.Tensor)
            else v for k, v in state.items()}  # fmt: skip


def _placed(state: dict[str, Any], device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], torch.Tensor):
            out[k] = v[0].to(device) if v[1] else v[0]
        else:
            out[k] = v
    return out


def _device(layer: nn.Module) -> torch.device:
    for t in layer.state_dict().values():
        return t.device
    return torch.device("cpu")
