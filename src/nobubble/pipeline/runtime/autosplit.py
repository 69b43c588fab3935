"""B/W split of any ``nn.Module``: B computes input gradients only, W every weight gradient.

:class:`ModuleSplit` is the runtime's one stage executor (runner, profiler, built-in models:
F, B, W, fused BW). Each parameter takes one of three paths (:meth:`ModuleSplit.report`
counts them): **linear** (every ``nn.Linear`` that runs goes through :mod:`.bw_split`'s
deferred linear: B computes ``dX`` and keeps ``(X, dY)``, W computes ``dW = dY^T X``,
``db``); **graph** (any other parameter: B is ``torch.autograd.grad`` to the stage input
and an *anchor* leaf every deferred linear takes, and keeps the gradient arriving where the
parameter's path meets B's; W runs ``torch.autograd.grad`` from those nodes to the
parameters, counting a shared gradient once); **stage graph** (a path that meets B nowhere:
W walks the stage's backward again). A stage whose input needs no gradient does all its work
in W. No ``.grad`` is touched in B.
"""

from __future__ import annotations

import types
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from nobubble.pipeline.runtime.bw_split import WeightGradStore, deferred_linear

__all__ = ["ModuleSplit", "SplitReport"]

_DEFERRED_NODE = "_DeferredLinearBackward"


@dataclass(frozen=True)
class SplitReport:
    """Where the weight gradients of one stage were computed in its last backward.

    Attributes:
        num_params: parameters of the stage that need a gradient.
        by_linear: deferred through ``nn.Linear`` (nothing runs twice).
        by_module_graph: from the nodes where their path meets B's (only those nodes' weight
            side runs again in W).
        by_stage_graph: from the stage output (the stage's backward walked again).
        linear_wgrad_flops: FLOPs of the deferred ``dW = dY^T X`` products, last microbatch.
        by_fused_backward: in the same walk as the input gradient (a fused BW action, where
            nothing waits: 1F1B, GPipe).
        by_w_walk: in W's one walk of the stage's backward (the stage input needs no
            gradient, so B had nothing to compute).
    """

    num_params: int
    by_linear: int
    by_module_graph: int
    by_stage_graph: int
    linear_wgrad_flops: int
    by_fused_backward: int = 0
    by_w_walk: int = 0

    @property
    def deferred_fraction(self) -> float:
        """Share of parameters whose gradient waited for W (1.0 after a split B / W)."""
        done = self.by_linear + self.by_module_graph + self.by_stage_graph + self.by_w_walk
        return done / self.num_params if self.num_params else 1.0


@dataclass(eq=False)
class _Group:
    """Parameters whose paths meet B's at shared nodes; W runs one ``autograd.grad`` for them,
    asking for these parameters only, so the walk stays on their side of the nodes."""

    params: list[nn.Parameter]
    meets: set[Node]


@dataclass
class _Pending:
    """What B leaves for W's graph path: the groups, the meeting nodes' kept gradients."""

    params: list[nn.Parameter] = field(default_factory=list)
    groups: list[_Group] = field(default_factory=list)
    grads: dict[Node, tuple[torch.Tensor | None, ...]] = field(default_factory=dict)
    by_stage_graph: int = 0
    keep: list[torch.Tensor] = field(default_factory=list)  # holds the graph alive until W
    whole: tuple[torch.Tensor, torch.Tensor | None] | None = None  # W walks it all
    plain: bool = False  # whole, recorded with split=False: autograd's own backward


class ModuleSplit:
    """The B/W split of one stage module, keyed by microbatch.

    Lifecycle of microbatch m: ``with split.recording(m): y = module(x)`` (F) ->
    ``split.backward_input(m, y, dy, x)`` (B, returns dX) -> ``split.backward_weight(m)`` (W),
    or F -> ``split.backward_full(m, y, dy, x)`` (BW: both in one walk of the graph).
    ``close()`` restores the module's own ``nn.Linear`` forwards.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.store = WeightGradStore()
        self.anchor = torch.zeros(0, requires_grad=True, device=_device_of(module))
        self._linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        for lin in self._linears:
            lin.forward = types.MethodType(_split_forward(self), lin)  # type: ignore[method-assign]
        self._params = [p for p in module.parameters() if p.requires_grad]
        # each parameter's gradient accumulator; held here, autograd reuses the same node in
        # every microbatch's graph (looking it up costs more than the rest of the plan)
        self._accs = [get_gradient_edge(p).node for p in self._params]
        self._recorded: set[int] = set()
        self._fused: set[int] = set()  # recorded with split=False
        self._pending: dict[int, _Pending] = {}
        self._last: SplitReport | None = None

    # -- F -----------------------------------------------------------------------------------
    @contextmanager
    def recording(self, microbatch: int, *, split: bool = True) -> Iterator[None]:
        """Run the stage's forward of ``microbatch`` inside this block.

        ``split=False``: nothing needs deferring: the microbatch's backward will be one fused
        BW, or a B with no input gradient (nothing for B to compute) and a W that walks it
        all. The linears run torch's own ``F.linear`` and that walk is autograd's plain
        backward (as fast as an unsplit module).
        """
        if microbatch in self._recorded:
            raise RuntimeError(f"F of microbatch {microbatch} twice")
        self._recorded.add(microbatch)
        if not split:
            self._fused.add(microbatch)
            yield
            return
        with self.store.recording(microbatch):
            yield

    def _take(self, microbatch: int, what: str) -> None:
        if microbatch not in self._recorded:
            raise RuntimeError(f"{what} of microbatch {microbatch} before its F")
        self._recorded.discard(microbatch)

    # -- B -----------------------------------------------------------------------------------
    def backward_input(
        self,
        microbatch: int,
        output: torch.Tensor,
        grad_output: torch.Tensor | None,
        stage_input: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Gradient of the stage input (None when it needs none); no ``.grad`` changes."""
        self._take(microbatch, "B")
        fused = microbatch in self._fused
        self._fused.discard(microbatch)
        if not _needs_grad(stage_input):  # nothing upstream waits: W does the one walk
            self._pending[microbatch] = _Pending(whole=(output, grad_output), plain=fused)
            return None
        if fused:
            raise RuntimeError(
                f"B of microbatch {microbatch}, recorded with split=False, needs an input "
                "gradient: record it split"
            )
        inputs = [stage_input, self.anchor]
        pending = self._plan(output, grad_output, inputs)
        meets = {node for g in pending.groups for node in g.meets}
        hooks = [node.register_prehook(_keeper(pending.grads, node)) for node in meets]
        try:
            grads = torch.autograd.grad(
                output, inputs, grad_output, retain_graph=bool(pending.params), allow_unused=True
            )
        finally:
            for h in hooks:
                h.remove()
        if pending.params:
            pending.keep = [output]
            self._pending[microbatch] = pending
        self.store.close_backward(microbatch)
        return grads[0]

    def _plan(
        self, output: torch.Tensor, grad_output: torch.Tensor | None, inputs: list[torch.Tensor]
    ) -> _Pending:
        """The parameters W's graph path must cover and the nodes where their paths meet B's."""
        root = output.grad_fn
        pending = _Pending()
        if root is None:
            return pending
        consumers = _consumers(root)
        closure = _upward_closure([get_gradient_edge(t).node for t in inputs], consumers)
        for p, acc in zip(self._params, self._accs, strict=True):
            users = consumers.get(acc, [])
            if not users or all(u.name() == _DEFERRED_NODE for u in users):
                continue  # unused here, or a linear weight: the store has it
            hit = _first_hits(acc, consumers, closure)
            pending.params.append(p)
            pending.by_stage_graph += not hit  # meets B nowhere: W starts at the output
            _join(pending.groups, p, hit or {root})
        if any(root in g.meets for g in pending.groups):  # B may not run the root at all
            pending.grads[root] = (
                grad_output if grad_output is not None else torch.ones_like(output),
            )
        return pending

    # -- BW ----------------------------------------------------------------------------------
    def backward_full(
        self,
        microbatch: int,
        output: torch.Tensor,
        grad_output: torch.Tensor | None,
        stage_input: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """B and W at once (1F1B's fused backward): one walk of the graph, which accumulates
        the non-linear parameters' gradients directly; the linears' products follow."""
        self._take(microbatch, "BW")
        if microbatch in self._fused:
            self._fused.discard(microbatch)
            return self._plain_walk(output, grad_output, stage_input, in_w=False)
        return self._one_walk(microbatch, output, grad_output, stage_input, fused=True)

    def _plain_walk(
        self,
        output: torch.Tensor,
        grad_output: torch.Tensor | None,
        stage_input: torch.Tensor | None,
        *,
        in_w: bool,
    ) -> torch.Tensor | None:
        """Autograd's own backward of a forward recorded with ``split=False`` (``in_w``: as
        W's one walk, the stage input needing no gradient; else as a fused BW)."""
        inputs = [stage_input, *self._params] if _needs_grad(stage_input) else self._params
        if inputs:
            torch.autograd.backward(output, grad_output, inputs=inputs)
        n = len(self._params)
        self._last = SplitReport(
            num_params=n, by_linear=0, by_module_graph=0, by_stage_graph=0, linear_wgrad_flops=0,
            by_fused_backward=0 if in_w else n, by_w_walk=n if in_w else 0,
        )  # fmt: skip
        return stage_input.grad if _needs_grad(stage_input) else None

    def _one_walk(
        self,
        microbatch: int,
        output: torch.Tensor,
        grad_output: torch.Tensor | None,
        stage_input: torch.Tensor | None,
        *,
        fused: bool,
    ) -> torch.Tensor | None:
        """One walk of the whole backward: the input gradient (``stage_input.grad``) and the
        non-linear parameters' gradients at once, then the deferred linears' products."""
        inputs = [self.anchor, *self._params]
        if _needs_grad(stage_input):
            inputs.insert(0, stage_input)
        torch.autograd.backward(output, grad_output, inputs=inputs)
        self.anchor.grad = None
        self.store.close_backward(microbatch)
        linear = len({id(p) for p in self.store.deferred_params(microbatch)})
        rest = len(self._params) - linear
        self._last = SplitReport(
            num_params=len(self._params),
            by_linear=linear,
            by_module_graph=0,
            by_stage_graph=0,
            linear_wgrad_flops=self.store.pending_flops(microbatch),
            by_fused_backward=rest if fused else 0,
            by_w_walk=0 if fused else rest,
        )
        self.store.flush(microbatch)
        return stage_input.grad if _needs_grad(stage_input) else None

    # -- W -----------------------------------------------------------------------------------
    def backward_weight(self, microbatch: int) -> None:
        """Accumulate every weight gradient of ``microbatch`` into ``.grad``."""
        first = self._pending.get(microbatch, _Pending())
        if first.whole is not None:
            del self._pending[microbatch]
            if first.plain:
                self._plain_walk(*first.whole, None, in_w=True)
            else:
                self._one_walk(microbatch, *first.whole, None, fused=False)
            return
        if not self.store.has_pending(microbatch):
            raise RuntimeError(f"W of microbatch {microbatch} before its B")
        linear = {id(p) for p in self.store.deferred_params(microbatch)}
        flops = self.store.pending_flops(microbatch)
        self.store.flush(microbatch)
        pending = self._pending.pop(microbatch, _Pending())
        for group in pending.groups:
            _group_backward(group, pending.grads)
        self._last = SplitReport(
            num_params=len(self._params),
            by_linear=len([p for p in self._params if id(p) in linear]),
            by_module_graph=len(pending.params) - pending.by_stage_graph,
            by_stage_graph=pending.by_stage_graph,
            linear_wgrad_flops=flops,
        )

    def report(self) -> SplitReport | None:
        """How the last backward computed this stage's gradients (None before the first)."""
        return self._last

    def close(self) -> None:
        """Give the module back as it was: its linears' own forwards."""
        for lin in self._linears:
            lin.__dict__.pop("forward", None)


def _join(groups: list[_Group], param: nn.Parameter, meets: set[Node]) -> None:
    """Add ``param`` with its meeting nodes, merging the groups that share one of them."""
    merged = _Group([param], set(meets))
    for g in [g for g in groups if g.meets & merged.meets]:
        groups.remove(g)
        merged.params = g.params + merged.params
        merged.meets |= g.meets
    groups.append(merged)


def _group_backward(group: _Group, kept: dict[Node, tuple[torch.Tensor | None, ...]]) -> None:
    """One group's weight gradients, from the gradients kept at its meeting nodes."""
    edges, seeds = [], []
    for node in group.meets:
        for i, g in enumerate(kept.get(node, ())):
            if g is not None:
                edges.append(GradientEdge(node, i))
                seeds.append(g)
    if not edges:
        return  # no gradient reached this group: its parameters do not affect the loss
    # a walk from one meeting node into another gets the kept gradient there, not twice it
    hooks = [node.register_prehook(lambda _, g=kept[node]: g) for node in group.meets
             if node in kept]  # fmt: skip
    try:
        dws = torch.autograd.grad(edges, group.params, seeds, retain_graph=True, allow_unused=True)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for p, dw in zip(group.params, dws, strict=True):
            if dw is not None:
                p.grad = dw if p.grad is None else p.grad.add_(dw)


def _needs_grad(t: torch.Tensor | None) -> TypeGuard[torch.Tensor]:
    """Whether ``t`` is a stage input autograd must give a gradient."""
    return t is not None and t.requires_grad


def _keeper(store: dict[Node, tuple[torch.Tensor | None, ...]], node: Node):
    """A pre-hook that keeps the gradients arriving at ``node`` (and lets them pass)."""

    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        store[node] = tuple(grad_outputs)

    return hook


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """For every node reachable from ``root``: the nodes that feed it gradients."""
    out: dict[Node, list[Node]] = defaultdict(list)
    seen, queue = {root}, deque([root])
    while queue:
        node = queue.popleft()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            out[nxt].append(node)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return out


def _upward_closure(starts: list[Node], consumers: dict[Node, list[Node]]) -> set[Node]:
    """The nodes from which a start is reachable: those a backward to the starts runs."""
    closure = set(starts)
    queue = deque(starts)
    while queue:
        for user in consumers.get(queue.popleft(), []):
            if user not in closure:
                closure.add(user)
                queue.append(user)
    return closure


def _first_hits(acc: Node, consumers: dict[Node, list[Node]], closure: set[Node]) -> set[Node]:
    """Walking up from ``acc``, the first nodes that are in ``closure``."""
    hits: set[Node] = set()
    seen, queue = {acc}, deque([acc])
    while queue:
        for user in consumers.get(queue.popleft(), []):
            if user in seen:
                continue
            seen.add(user)
            if user in closure:
                hits.add(user)
            else:
                queue.append(user)
    return hits


def _split_forward(split: ModuleSplit):
    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        store = split.store
        mb = store.recording_microbatch
        if mb is None or not torch.is_grad_enabled() or not self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return deferred_linear(x, self.weight, self.bias, store, mb, anchor=split.anchor)

    return forward


def _device_of(module: nn.Module) -> torch.device:
    p = next(iter(module.parameters()), None)
    return p.device if p is not None else torch.device("cpu")
