"""The configs of ``ep bench`` (:class:`BenchConfig`) and ``ep train`` (:class:`TrainConfig`),
without torch: the command line builds them and checks their budgets (``data_bytes()``)
before it imports torch, so that a bad flag is refused at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nobubble.budget import check_budget, check_steps
from nobubble.moe.layout import TRANSPORT_KINDS, MoEConfig, num_local_experts
from nobubble.settings import BOOL, Settings, setting

__all__ = ["BenchConfig", "MethodResult", "TrainConfig", "DTYPE_NAMES", "STEP_S", "VOCAB_BOUND"]

DTYPE_NAMES = ("bf16", "fp32")
"""``ep bench``'s payload dtypes (:data:`.ep_dispatch.DTYPES` maps them to torch's)."""
MAX_ITERS = 1000
"""More timed iterations than this add nothing to a median and can run for hours."""
STEP_S = 0.01
"""The fastest training step of the smallest run (4 ranks, a 2-layer model of width 32)."""
VOCAB_BOUND = 128
"""The character vocabulary of :func:`corpus` stays under this many symbols."""


@dataclass(frozen=True, kw_only=True)
class BenchConfig(Settings):
    """One benchmark run."""

    num_ranks: int = setting(4, ">= 1", integer=True, help="local processes (EP ranks)")
    num_tokens: int = setting(4096, ">= 1", integer=True, help="tokens per rank")
    hidden: int = setting(7168, ">= 1", integer=True, help="hidden size")
    num_experts: int = setting(256, ">= 1", integer=True, help="routed experts (k x num_ranks)")
    topk: int = setting(8, ">= 1", integer=True, help="experts per token")
    dtype: str = setting("bf16", DTYPE_NAMES, help="payload dtype")
    num_iters: int = setting(3, ">= 1", integer=True, help="timed iterations per method")
    num_warmup: int = setting(1, ">= 0", integer=True, help="untimed iterations per method")
    timeout_s: float = setting(1800.0, "> 0", help="seconds, the run's and each collective's")
    seed: int = setting(0, ">= 0", integer=True, help="routing and payload seed")
    # auto: shared memory for gloo on one CPU host; shm; dist: gloo collectives
    transport: str = setting("auto", TRANSPORT_KINDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        num_local_experts(self.num_experts, self.num_ranks)
        if self.topk > self.num_experts:
            raise ValueError(
                f"BenchConfig.topk={self.topk} exceeds num_experts={self.num_experts}; lower topk"
            )

    def data_bytes(self) -> int:
        """The run's memory past its processes'. Per rank: its tokens, the rows it receives
        (up to one per token and rank it reaches), the combined output and the baselines'
        copies: about ``topk + 4`` token-sized buffers; and a few int64 counts and maps per
        expert."""
        elem = 2 if self.dtype == "bf16" else 4
        per_rank = self.num_tokens * self.hidden * elem * (self.topk + 4) + 64 * self.num_experts
        return self.num_ranks * per_rank

    def check_budget(self, *, force: bool) -> None:
        """Refuse (ValueError naming the flag and ``--force``), unless ``force``, a run past
        :data:`MAX_ITERS` timed or untimed iterations or the process and memory budget."""
        for flag, count in (("--iters", self.num_iters), ("--warmup", self.num_warmup)):
            if count > MAX_ITERS and not force:
                raise ValueError(f"{flag} {count} is past the budget of {MAX_ITERS} (a median "
                                 "needs far fewer); lower it, or --force")  # fmt: skip
        check_budget("ep bench", processes=self.num_ranks, data_bytes=self.data_bytes(),
                     force=force)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Settings):
    """One training run (defaults: 4 ranks x 20 steps in well under a minute on 2 CPU cores)."""

    num_ranks: int = setting(4, ">= 1", integer=True, help="R local gloo processes")
    ep: int = setting(
        0, ">= 0", integer=True, help="EP ranks per group, dp = R / ep (default: gcd(R, E))"
    )
    num_steps: int = setting(20, ">= 1", integer=True, help="optimizer steps")
    num_experts: int = setting(8, ">= 1", integer=True, help="E routed experts per MoE layer")
    topk: int = setting(2, ">= 1", integer=True, help="routed experts per token")
    n_groups: int = setting(2, ">= 1", integer=True)  # DeepSeek-V3 expert groups
    topk_groups: int = setting(1, ">= 1", integer=True)  # groups a token may route to
    num_redundant: int = setting(
        0, ">= 0", integer=True, help="extra physical experts per layer, a multiple of ep"
    )
    rebalance_every: int = setting(
        0, ">= 0", integer=True, help="online EPLB every K steps (default: never)"
    )
    hidden: int = setting(32, ">= 1", integer=True)  # model width
    expert_hidden: int = setting(32, ">= 1", integer=True)  # intermediate width of an expert
    num_heads: int = setting(4, ">= 1", integer=True)  # attention heads
    num_layers: int = setting(2, ">= 1", integer=True)  # transformer blocks (one MoE FFN each)
    seq_len: int = setting(32, ">= 1", integer=True)  # T characters per sequence
    batch_size: int = setting(8, ">= 1", integer=True, help="B sequences per rank and step")
    lr: float = setting(3e-3, "> 0", help="AdamW learning rate")
    bias_update_rate: float = setting(1e-3, ">= 0")  # aux-loss-free bias step (DeepSeek's gamma)
    seed: int = setting(0, ">= 0", integer=True, help="model and data seed")
    check_dense: bool = setting(
        False, BOOL, help="also train the dense model in one process; compare losses"
    )
    timeout_s: float = setting(600.0, "> 0", help="seconds, the job's and each collective's")

    def __post_init__(self) -> None:
        super().__post_init__()
        ep, ranks = self.expert_parallel, self.num_ranks
        if ranks % ep:
            raise ValueError(
                f"TrainConfig: ep={ep} does not divide num_ranks={ranks}; pick a divisor"
            )
        if self.num_experts % ep or self.num_redundant % ep:
            raise ValueError(
                f"TrainConfig: num_experts={self.num_experts} and num_redundant="
                f"{self.num_redundant} must be multiples of ep={ep}; change them or ep"
            )
        if self.num_redundant > self.num_experts * (ep - 1):
            raise ValueError(
                f"TrainConfig: num_redundant={self.num_redundant} is past "
                f"{self.num_experts * (ep - 1)}, one replica of every expert on every other "
                f"expert-parallel rank; use fewer"
            )
        if self.hidden % self.num_heads:
            raise ValueError(
                f"TrainConfig: hidden={self.hidden} is not a multiple of num_heads={self.num_heads}"
            )
        if self.rebalance_every and ep == 1:
            raise ValueError(
                f"TrainConfig: rebalance_every={self.rebalance_every} with ep 1: every expert "
                "is on every rank and no placement differs; use ep 2 or more, or rebalance_every=0"
            )
        self.moe_config()  # routing constraints, with MoEConfig's messages
        reachable = self.num_experts // self.n_groups * self.topk_groups
        if self.topk > reachable:
            raise ValueError(
                f"TrainConfig: topk={self.topk} exceeds the {reachable} experts a token can "
                f"reach in topk_groups={self.topk_groups} of {self.n_groups} groups; lower topk"
            )

    @property
    def expert_parallel(self) -> int:
        """``ep``, resolved."""
        return self.ep or math.gcd(self.num_ranks, self.num_experts)

    @property
    def replicated(self) -> bool:
        """Whether the MoE layers hold physical experts (replicas, or moving experts)."""
        return self.num_redundant > 0 or self.rebalance_every > 0

    def data_bytes(self) -> float:
        """The run's memory past its processes': every physical expert's weights with their
        gradients and Adam's two moments (16 bytes a parameter; the dense reference holds them
        once more), and each rank's activations (fp32, ~16 hidden-sized and 3 topk x
        expert-sized tensors a token and layer, and the logits)."""
        c = self
        experts = c.num_layers * (c.num_experts + c.num_redundant) * 3 * c.hidden * c.expert_hidden
        weights = 16.0 * experts * (2 if c.check_dense else 1)
        per_token = c.num_layers * (16 * c.hidden + 3 * c.topk * c.expert_hidden) + 3 * VOCAB_BOUND
        return weights + 4.0 * c.num_ranks * c.batch_size * c.seq_len * per_token

    def check_budget(self, *, force: bool) -> None:
        """Refuse (ValueError naming the flag and ``--force``), unless ``force``, a run past
        the process and memory budget or whose ``num_steps`` cannot end within ``timeout_s``."""
        check_budget("ep train", processes=self.num_ranks, data_bytes=self.data_bytes(),
                     force=force)  # fmt: skip
        check_steps("ep train", "--steps", self.num_steps, STEP_S, limit_s=self.timeout_s,
                    limit=f"--timeout {self.timeout_s:g} s, the whole run's limit",
                    hint=", raise --timeout", force=force)  # fmt: skip

    def moe_config(self) -> MoEConfig:
        return MoEConfig(
            hidden=self.hidden, expert_hidden=self.expert_hidden, num_experts=self.num_experts,
            topk=self.topk, num_shared_experts=1, router="deepseek_v3", n_groups=self.n_groups,
            topk_groups=self.topk_groups, bias_update_rate=self.bias_update_rate,
        )  # fmt: skip


@dataclass(frozen=True)
class MethodResult:
    """``ep bench``'s figures for one dispatcher (also its JSON schema: torch-free, so the
    docs tables load it): times in ms (median over iterations of the slowest rank), logical
    bandwidth per rank in GB/s, bytes summed over ranks for one dispatch / combine."""

    method: str
    dispatch_ms: float
    combine_ms: float
    dispatch_logical_gbps: float
    combine_logical_gbps: float
    dispatch_payload_bytes: int
    dispatch_remote_bytes: int
    dispatch_metadata_bytes: int
    combine_payload_bytes: int
    combine_remote_bytes: int
    correct: bool
    verdict: str
