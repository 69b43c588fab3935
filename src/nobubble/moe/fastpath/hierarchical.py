"""Hierarchical dispatch / combine: cross node boundaries once per (token, node), forward inside.

:class:`HierarchicalRows` (``Buffer(..., topology=Topology(ranks_per_node=P))``) sends a token
over its *rail* (the ranks with the same local index on every node) once per destination node,
and the receiver forwards it inside its *node* (the buffer's ``transport`` kind). Received
rows keep the flat order (source rank, then source token); dispatch is bit-identical to the
flat one. Combine sums ranks of a node first (float32 for 16-bit inputs, the node partial
rounded to the payload dtype), then nodes in order. See ``docs/moe/fastpath.md``.

Shape legend: ``N`` tokens, ``R`` ranks, ``P`` ranks per node, ``D = R / P`` nodes, ``S1`` rows
this rank sends across its rail, ``M1`` rows it receives there (to forward), ``S2`` rows it
forwards inside its node, ``M`` rows it finally receives.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist

from nobubble.moe.fastpath.shm_transport import make_transport
from nobubble.moe.handle import DispatchHandle
from nobubble.moe.transport import TorchDistTransport, Transport

__all__ = ["Topology", "HierarchicalRows", "HierarchicalPlan", "node_groups"]


@dataclass(frozen=True)
class Topology:
    """How the expert-parallel group's ranks sit on nodes.

    Attributes:
        ranks_per_node: ``P``; ranks ``[n*P, (n+1)*P)`` of the group form node ``n`` (it must
            divide the group size; across hosts, the ranks per host).
    """

    ranks_per_node: int

    def __post_init__(self) -> None:
        p = self.ranks_per_node
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"Topology: ranks_per_node={p!r} must be an int >= 1")


@dataclass(frozen=True, eq=False)
class HierarchicalPlan:
    """The two-step routes of one dispatch, derived from its handle.

    Attributes:
        send1_token: ``[S1]`` int64, local token of each row sent on the rail, by destination
            node then token.
        send1_counts / recv1_counts: ``D`` ints, rows sent to / received from each node.
        send2_row: ``[S2]`` int64, the rail-received row behind each forwarded row, by
            destination local rank then row.
        send2_counts / recv2_counts: ``P`` ints, rows forwarded to / received from each local
            rank.
        order: ``[M]`` int64, final row ``k`` is received row ``order[k]`` (rows arrive by
            forwarder, then source node; Buffer's order is by source rank).
        node: this rank's node.
    """

    send1_token: torch.Tensor
    send1_counts: tuple[int, ...]
    recv1_counts: tuple[int, ...]
    send2_row: torch.Tensor
    send2_counts: tuple[int, ...]
    recv2_counts: tuple[int, ...]
    order: torch.Tensor
    node: int

    @property
    def num_inter_node_rows(self) -> int:
        """Rows that leave this rank's node in one dispatch: distinct (token, other node) pairs."""
        return sum(self.send1_counts) - self.send1_counts[self.node]


def node_groups(
    group: dist.ProcessGroup | None, ranks_per_node: int
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """Create every node group and every rail group (all ranks must call this together) and
    return this rank's ``(node_group, rail_group)``."""
    world = dist.get_world_size(group)
    members = [dist.get_global_rank(group, i) if group is not None else i for i in range(world)]
    rank = dist.get_rank(group)
    num_nodes = world // ranks_per_node
    mine_node = mine_rail = None
    for n in range(num_nodes):
        g = dist.new_group(members[n * ranks_per_node : (n + 1) * ranks_per_node])
        if n == rank // ranks_per_node:
            mine_node = g
    for lr in range(ranks_per_node):
        g = dist.new_group(members[lr::ranks_per_node])
        if lr == rank % ranks_per_node:
            mine_rail = g
    return mine_node, mine_rail


class HierarchicalRows:
    """Row movers whose payload crosses nodes once per (token, destination node).

    Args:
        group: the expert-parallel group (``None`` = default).
        topology: its nodes; ``topology.ranks_per_node`` must divide the group size.
        intra: transport kind inside a node: ``"auto"`` (shared memory for gloo on CPU within
            one host), ``"shm"`` or ``"dist"``.
        timeout_s: per-collective timeout.

    Building it is a collective over ``group`` (it creates every node and rail group).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        topology: Topology,
        *,
        intra: str,
        timeout_s: float,
    ) -> None:
        world = dist.get_world_size(group)
        p = topology.ranks_per_node
        if world % p != 0:
            raise ValueError(
                f"Buffer: topology.ranks_per_node={p} must divide the group size {world}; use "
                f"one of {[q for q in range(1, world + 1) if world % q == 0]}"
            )
        self.rank = dist.get_rank(group)
        self.ranks_per_node = p
        self.num_nodes = world // p
        self.node, self.local_rank = divmod(self.rank, p)
        node_group, rail_group = node_groups(group, p)
        self.inter: Transport = TorchDistTransport(rail_group, timeout_s=timeout_s)
        self.intra: Transport = make_transport(intra, node_group, timeout_s=timeout_s)
        self._plans: weakref.WeakKeyDictionary[DispatchHandle, HierarchicalPlan] = (
            weakref.WeakKeyDictionary()
        )

    def close(self) -> None:
        """Close both step transports (the intra-node one may hold shared memory)."""
        self.inter.close()
        self.intra.close()

    # -- routes -----------------------------------------------------------------------------
    def plan(self, handle: DispatchHandle) -> HierarchicalPlan:
        """The two-step routes for ``handle`` (computed once, with one small rail exchange)."""
        plan = self._plans.get(handle)
        if plan is None:
            plan = self._make_plan(handle)
            self._plans[handle] = plan
        return plan

    def _make_plan(self, handle: DispatchHandle) -> HierarchicalPlan:
        p, d = self.ranks_per_node, self.num_nodes
        n = handle.num_tokens
        in_rank = handle.is_token_in_rank.reshape(n, d, p)  # (N, D, P)
        in_node = in_rank.any(dim=2)  # (N, D)
        pairs = in_node.t().nonzero()  # (S1, 2): (node, token), node-major
        send1_token = pairs[:, 1].contiguous()
        send1_counts = in_node.sum(dim=0).tolist()
        masks = in_rank[send1_token, pairs[:, 0]].to(torch.uint8)  # (S1, P) who needs it there
        ones = [1] * d
        recv1_counts = (
            self.inter.all_to_all(
                torch.tensor(send1_counts, dtype=torch.int64, device=masks.device).view(d, 1),
                ones,
                ones,
                kind="hier_layout",
            )
            .view(-1)
            .tolist()
        )
        recv_masks = self.inter.all_to_all(masks, send1_counts, recv1_counts, kind="hier_meta")
        fwd = recv_masks.bool().t().nonzero()  # (S2, 2): (local rank, row), local-rank-major
        send2_row = fwd[:, 1].contiguous()
        send2_counts = recv_masks.bool().sum(dim=0).tolist() if recv_masks.numel() else [0] * p
        # Rows from global source g = s * P + l arrive from forwarder l, in block s.
        num_recv = handle.num_recv_tokens_per_rank
        recv2_counts = [sum(num_recv[s * p + lr] for s in range(d)) for lr in range(p)]
        final_off = list(accumulate(num_recv, initial=0))
        order = torch.empty(final_off[-1], dtype=torch.int64)  # built on CPU, moved below
        pos = 0
        for lr in range(p):
            for s in range(d):
                g = s * p + lr
                order[final_off[g] : final_off[g + 1]] = torch.arange(pos, pos + num_recv[g])
                pos += num_recv[g]
        return HierarchicalPlan(
            send1_token=send1_token,
            send1_counts=tuple(int(c) for c in send1_counts),
            recv1_counts=tuple(int(c) for c in recv1_counts),
            send2_row=send2_row,
            send2_counts=tuple(int(c) for c in send2_counts),
            recv2_counts=tuple(recv2_counts),
            order=order.to(send1_token.device),
            node=self.node,
        )

    # -- row movers (used by the buffer's autograd functions) -------------------------------
    def dispatch_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[N, *]`` -> ``[M, *]``: rail step (once per node), then forward inside the node."""
        plan = self.plan(handle)
        send1 = t.index_select(0, plan.send1_token)  # (S1, *)
        recv1 = self.inter.all_to_all(send1, plan.send1_counts, plan.recv1_counts, kind=kind)
        send2 = recv1.index_select(0, plan.send2_row)  # (S2, *)
        recv2 = self.intra.all_to_all(send2, plan.send2_counts, plan.recv2_counts, kind=kind)
        return recv2.index_select(0, plan.order)  # (M, *) by source rank, token order

    def combine_rows(self, t: torch.Tensor, handle: DispatchHandle, *, kind: str) -> torch.Tensor:
        """``[M, *]`` -> ``[N, *]``: back to the forwarders, reduce inside the node (local-rank
        order), one partial per (token, node) across the rail, sum over nodes in order."""
        plan = self.plan(handle)
        acc_dtype = torch.float32 if t.element_size() < 4 and t.is_floating_point() else t.dtype
        arrival = torch.empty_like(t)
        arrival[plan.order] = t  # (M, *) back in arrival order: by forwarder, then node
        back2 = self.intra.all_to_all(arrival, plan.recv2_counts, plan.send2_counts, kind=kind)
        rows1 = sum(plan.recv1_counts)
        partial = torch.zeros((rows1, *t.shape[1:]), dtype=acc_dtype, device=t.device)  # (M1, *)
        off = list(accumulate(plan.send2_counts, initial=0))
        for q in range(self.ranks_per_node):  # local-rank order, unique rows per segment
            seg = slice(off[q], off[q + 1])
            partial.index_add_(0, plan.send2_row[seg], back2[seg].to(acc_dtype))
        back1 = self.inter.all_to_all(
            partial.to(t.dtype), plan.recv1_counts, plan.send1_counts, kind=kind
        )  # (S1, *) aligned with send1_token
        out = torch.zeros((handle.num_tokens, *t.shape[1:]), dtype=acc_dtype, device=t.device)
        off = list(accumulate(plan.send1_counts, initial=0))
        for node in range(self.num_nodes):  # node order
            seg = slice(off[node], off[node + 1])
            out.index_add_(0, plan.send1_token[seg], back1[seg].to(acc_dtype))
        return out.to(t.dtype)
