"""B/W split of any ``nn.Module``: B computes input gradients only, W every weight gradient.

:mod:`.bw_split` defers the weight gradient of the runtime's own ``SplitLinear``. A user's
model has plain ``nn.Linear`` layers, and parameters that are used without any linear
forward (``nn.MultiheadAttention``'s ``in_proj_weight``, convolutions, embeddings, norms).
:class:`ModuleSplit` covers all of them, in three ways, cheapest first:

1. **linear**: every ``nn.Linear`` whose forward runs gets an instance ``forward`` that goes
   through the deferred linear of :mod:`.bw_split` (the parameters are the module's own, no
   copy): B computes ``dX`` and leaves ``(X, dY)``; W computes ``dW = dY^T X``, ``db``.
2. **module graph**: every other module that owns parameters (a *unit*: its direct
   parameters and those of its ``nn.Linear`` children, which such modules often use
   functionally) records its outputs during F. B asks autograd for the gradient of those
   outputs (cheap: they lie on the path to the stage input anyway) and keeps the graph; W
   runs ``torch.autograd.backward(unit outputs, their gradients, inputs=unit parameters)``,
   which walks the unit's own backward only.
3. **stage graph**: a parameter that neither path saw (a module that uses a child's weight
   functionally without owning a parameter itself) gets its gradient in W from the stage
   output's gradient, walking the stage's backward again. Correct; :meth:`ModuleSplit.report`
   names how many parameters took this path.

B is ``torch.autograd.grad`` with respect to the stage input, the units' outputs and an
*anchor* (a 0-element leaf every deferred linear takes as an extra input, so that autograd
visits every linear, even one whose input needs no gradient): no ``.grad`` is touched in B.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from nobubble.pipeline.runtime.bw_split import WeightGradStore, deferred_linear

__all__ = ["ModuleSplit", "SplitReport"]


@dataclass(frozen=True)
class SplitReport:
    """Where the weight gradients of one stage were computed (all of them in W).

    Attributes:
        num_params: parameters of the stage that need a gradient.
        by_linear: of those, deferred through ``nn.Linear`` (no backward walked twice).
        by_module_graph: from their module's outputs (the module's backward walked again).
        by_stage_graph: from the stage output (the stage's backward walked again).
        linear_wgrad_flops: FLOPs of the deferred ``dW = dY^T X`` products, last microbatch.
    """

    num_params: int
    by_linear: int
    by_module_graph: int
    by_stage_graph: int
    linear_wgrad_flops: int

    @property
    def deferred_fraction(self) -> float:
        """Share of parameters whose gradient waits for W (1.0 here: every one)."""
        done = self.by_linear + self.by_module_graph + self.by_stage_graph
        return done / self.num_params if self.num_params else 1.0


@dataclass
class _Microbatch:
    """What F and B leave for W: unit outputs and their gradients, the stage output."""

    unit_outputs: list[tuple[int, list[torch.Tensor]]] = field(default_factory=list)
    unit_grads: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]] = field(
        default_factory=list
    )
    output: torch.Tensor | None = None
    grad_output: torch.Tensor | None = None


class ModuleSplit:
    """The B/W split of one stage module, keyed by microbatch.

    Lifecycle of microbatch m: ``with split.recording(m): y = module(x)`` (F) ->
    ``split.backward_input(m, y, dy, x)`` (B, returns dX) -> ``split.backward_weight(m)`` (W).
    ``close()`` restores the module's own ``nn.Linear`` forwards.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.store = WeightGradStore()
        self.anchor = torch.zeros(0, requires_grad=True, device=_device_of(module))
        self._linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        for lin in self._linears:
            lin.forward = types.MethodType(_split_forward(self), lin)  # type: ignore[method-assign]
        self._units = [
            m
            for m in module.modules()
            if not isinstance(m, nn.Linear) and any(True for _ in m.parameters(recurse=False))
        ]
        self._unit_params = [_unit_params(u) for u in self._units]
        self._hooks = [
            u.register_forward_hook(self._unit_hook(i)) for i, u in enumerate(self._units)
        ]
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._mbs: dict[int, _Microbatch] = {}
        self._recording: int | None = None
        self._last: SplitReport | None = None
        self._flops = 0

    # -- F -----------------------------------------------------------------------------------
    @contextmanager
    def recording(self, microbatch: int) -> Iterator[None]:
        """Run the stage's forward of ``microbatch`` inside this block."""
        if microbatch in self._mbs:
            raise RuntimeError(f"F of microbatch {microbatch} twice")
        self._mbs[microbatch] = _Microbatch()
        with self.store.recording(microbatch):
            self._recording = microbatch
            try:
                yield
            finally:
                self._recording = None

    def _unit_hook(self, index: int):
        def hook(module: nn.Module, args: object, output: object) -> None:
            if self._recording is None or not torch.is_grad_enabled():
                return
            outs = [t for t in _tensors(output) if t.requires_grad]
            if outs:
                self._mbs[self._recording].unit_outputs.append((index, outs))

        return hook

    # -- B -----------------------------------------------------------------------------------
    def backward_input(
        self,
        microbatch: int,
        output: torch.Tensor,
        grad_output: torch.Tensor | None,
        stage_input: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Gradient of the stage input (None when it needs none); no ``.grad`` changes."""
        mb = self._mbs.get(microbatch)
        if mb is None:
            raise RuntimeError(f"B of microbatch {microbatch} before its F")
        wants_input = stage_input is not None and stage_input.requires_grad
        flat = [t for _, outs in mb.unit_outputs for t in outs]
        inputs = [self.anchor, *flat]
        if stage_input is not None and wants_input:
            inputs.insert(0, stage_input)
        seen = self._seen_params(microbatch, mb)
        stage_graph = [p for p in self._params if id(p) not in seen]
        retain = bool(flat or stage_graph)
        grads = torch.autograd.grad(
            output, inputs, grad_output, retain_graph=retain, allow_unused=True
        )
        grad_input = grads[0] if wants_input else None
        it = iter(grads[(1 if wants_input else 0) + 1 :])
        for index, outs in mb.unit_outputs:
            gs = [next(it) for _ in outs]
            kept = [(o, g) for o, g in zip(outs, gs, strict=True) if g is not None]
            if kept:
                mb.unit_grads.append((index, [o for o, _ in kept], [g for _, g in kept]))
        mb.unit_outputs = []
        if stage_graph:
            mb.output, mb.grad_output = output, grad_output
        self.store.close_backward(microbatch)
        return grad_input

    def _seen_params(self, microbatch: int, mb: _Microbatch) -> set[int]:
        """Parameters a linear deferred or a recorded unit covers, for ``microbatch``."""
        seen = {id(p) for p in self.store.deferred_params(microbatch)}
        for index, _ in mb.unit_outputs:
            seen.update(id(p) for p in self._unit_params[index])
        return seen

    # -- W -----------------------------------------------------------------------------------
    def backward_weight(self, microbatch: int) -> None:
        """Accumulate every weight gradient of ``microbatch`` into ``.grad``."""
        mb = self._mbs.pop(microbatch, None)
        if mb is None:
            raise RuntimeError(f"W of microbatch {microbatch} before its F")
        deferred = {id(p) for p in self.store.deferred_params(microbatch)}
        self._flops = self.store.pending_flops(microbatch)
        self.store.flush(microbatch)
        by_unit: set[int] = set()
        for index, outs, grads in mb.unit_grads:
            params = [p for p in self._unit_params[index] if id(p) not in deferred]
            if params:
                torch.autograd.backward(outs, grads, inputs=params, retain_graph=True)
                by_unit.update(id(p) for p in params)
        rest = [p for p in self._params if id(p) not in deferred and id(p) not in by_unit]
        if rest and mb.output is not None:
            torch.autograd.backward(mb.output, mb.grad_output, inputs=rest)
        self._last = SplitReport(
            num_params=len(self._params),
            by_linear=len([p for p in self._params if id(p) in deferred]),
            by_module_graph=len(by_unit),
            by_stage_graph=len(rest) if mb.output is not None else 0,
            linear_wgrad_flops=self._flops,
        )

    def report(self) -> SplitReport | None:
        """How the last W computed this stage's gradients (None before the first W)."""
        return self._last

    def close(self) -> None:
        """Give the module back as it was: linear forwards and hooks removed."""
        for lin in self._linears:
            lin.__dict__.pop("forward", None)
        for h in self._hooks:
            h.remove()


def _split_forward(split: ModuleSplit):
    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        store = split.store
        mb = store.recording_microbatch
        if mb is None or not torch.is_grad_enabled() or not self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return deferred_linear(x, self.weight, self.bias, store, mb, anchor=split.anchor)

    return forward


def _unit_params(unit: nn.Module) -> list[nn.Parameter]:
    """A unit's direct parameters and those of its ``nn.Linear`` children."""
    params = list(unit.parameters(recurse=False))
    for child in unit.children():
        if isinstance(child, nn.Linear):
            params.extend(child.parameters(recurse=False))
    return [p for p in params if p.requires_grad]


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        return [t for item in obj for t in _tensors(item)]
    return []


def _device_of(module: nn.Module) -> torch.device:
    p = next(iter(module.parameters()), None)
    return p.device if p is not None else torch.device("cpu")
