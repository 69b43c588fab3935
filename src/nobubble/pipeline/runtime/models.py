"""Models as lists of blocks: a small GPT and a residual MLP, built block by block.

Every block is built from its own seed (``seed``, block index), so a rank can build only its
stages' blocks and get the single-process reference's weights. Block contract:
``block(x) -> y``; the first block takes the model input (token ids ``(B, T) int64`` for the
GPT, features ``(B, D) float`` for the MLP), every later one the previous block's float
output; ``loss(output, targets)`` is the batch mean. Torch is imported only inside the
functions that build or run a model, so a config is checked without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nobubble.pipeline.partition import equal_sizes, stage_ranges
from nobubble.settings import Settings, setting
from nobubble.validation import check_value

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "Batch", "GPTConfig", "MLPConfig", "ModelConfig", "build_blocks", "partition_blocks",
    "memory_bytes", "FLOPS_PER_S", "OP_OVERHEAD_S", "train_seconds", "profile_seconds",
]  # fmt: skip


@dataclass(frozen=True)
class Batch:
    """One global batch: ``inputs`` (B, ...) and ``targets`` (B, ...) on the same device."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def split(self, num_microbatches: int) -> list[Batch]:
        """Equal microbatches along dim 0 (B must be divisible by ``num_microbatches``)."""
        size = self.inputs.shape[0]
        if size % num_microbatches:
            raise ValueError(
                f"batch size {size} is not divisible by num_microbatches={num_microbatches}"
            )
        xs = self.inputs.chunk(num_microbatches)
        ys = self.targets.chunk(num_microbatches)
        return [Batch(x, y) for x, y in zip(xs, ys, strict=True)]


class _InputBodyHead:
    """Block layout shared by the built-in models: block 0 takes the input, blocks
    ``1..num_layers`` are the body, the last block is the head."""

    num_layers: int

    @property
    def num_blocks(self) -> int:
        return self.num_layers + 2

    def block_weight(self, index: int) -> int:
        """Compute weight used to balance stages: body blocks 1, input/head blocks 0."""
        return 0 if index in (0, self.num_blocks - 1) else 1


# ---------------------------------------------------------------------------------------------
# GPT


@dataclass(frozen=True, kw_only=True)
class GPTConfig(_InputBodyHead, Settings):
    """A pre-LayerNorm GPT: embedding block, ``num_layers`` transformer blocks, LM-head block
    (each size's help: its ``pp`` flag's, which the MLP shares where it has the field)."""

    vocab_size: int = setting(256, ">= 1", integer=True, help="vocabulary (gpt)")
    seq_len: int = setting(32, ">= 1", integer=True, help="tokens per sample (gpt)")
    hidden: int = setting(64, ">= 1", integer=True, help="hidden size")
    num_heads: int = setting(4, ">= 1", integer=True, help="attention heads (gpt)")
    num_layers: int = setting(4, ">= 1", integer=True, help="transformer / MLP blocks")
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden % self.num_heads:
            raise ValueError(f"GPTConfig.hidden={self.hidden} is not divisible by num_heads="
                             f"{self.num_heads}; give hidden a multiple of num_heads")  # fmt: skip

    @property
    def name(self) -> str:
        return "gpt"

    @property
    def num_parameters(self) -> int:
        """Every block's parameters, counted without building them: the embeddings, each
        layer's 12 h^2 + 13 h (two LayerNorms, qkv, proj, fc, fc_out) and the head."""
        h, layers, vocab = self.hidden, self.num_layers, self.vocab_size
        return (vocab + self.seq_len) * h + layers * (12 * h * h + 13 * h) + 2 * h + h * vocab

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def activations_per_token(self) -> int:
        """Activation values a token keeps for its backward: ~40 hidden-sized tensors a layer
        (attention and MLP inputs, their norms, the 4h MLP hidden), plus the logits."""
        return 40 * self.hidden * self.num_layers + 3 * self.vocab_size

    def build_block(self, index: int) -> nn.Module:
        from nobubble.pipeline.runtime.layers import Embedding, LMHead, TransformerBlock

        if index == 0:
            return Embedding(self.vocab_size, self.seq_len, self.hidden)
        if index == self.num_blocks - 1:
            return LMHead(self.hidden, self.vocab_size)
        return TransformerBlock(self.hidden, self.num_heads)

    def make_batch(self, batch_size: int, seed: int, device: torch.device | str = "cpu") -> Batch:
        """Random token sequences; the target is the input shifted by one."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.vocab_size, (batch_size, self.seq_len + 1), generator=gen)
        return Batch(tokens[:, :-1].to(device), tokens[:, 1:].to(device))  # (B, T) each

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; logits (B, T, V), targets (B, T) int64."""
        import torch.nn.functional as F

        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------
# MLP


@dataclass(frozen=True, kw_only=True)
class MLPConfig(_InputBodyHead, Settings):
    """Input projection, ``num_layers`` residual MLP blocks, classifier head (cross-entropy)."""

    in_features: int = setting(32, ">= 1", integer=True)
    hidden: int = setting(64, ">= 1", integer=True, help="hidden size")
    num_classes: int = setting(10, ">= 1", integer=True)
    num_layers: int = setting(4, ">= 1", integer=True, help="transformer / MLP blocks")
    seed: int = 0

    @property
    def name(self) -> str:
        return "mlp"

    @property
    def num_parameters(self) -> int:
        """Every block's parameters: the input projection, each residual block's
        8 h^2 + 7 h (LayerNorm, fc1, fc2) and the classifier."""
        h, classes = self.hidden, self.num_classes
        return (
            (self.in_features + 1) * h + self.num_layers * (8 * h * h + 7 * h) + (h + 1) * classes
        )

    @property
    def tokens_per_sample(self) -> int:
        return 1

    @property
    def activations_per_token(self) -> int:
        """Activation values a sample keeps for its backward: ~10 hidden-sized tensors a
        residual block."""
        return 10 * self.hidden * self.num_layers

    def build_block(self, index: int) -> nn.Module:
        from torch import nn

        from nobubble.pipeline.runtime.layers import ResidualMLP

        if index == 0:
            return nn.Linear(self.in_features, self.hidden)
        if index == self.num_blocks - 1:
            return nn.Linear(self.hidden, self.num_classes)
        return ResidualMLP(self.hidden)

    def make_batch(self, batch_size: int, seed: int, device: torch.device | str = "cpu") -> Batch:
        import torch

        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, self.in_features, generator=gen)  # (B, D)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=gen)  # (B,)
        return Batch(x.to(device), y.to(device))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.cross_entropy(logits, targets)


ModelConfig = GPTConfig | MLPConfig


def memory_bytes(model: ModelConfig, *, microbatch_size: int, num_ranks: int) -> float:
    """About what training ``model`` holds in all: weights, gradients and AdamW state (16
    bytes a parameter) and ~``num_ranks`` microbatches of ``microbatch_size`` samples of fp32
    activations in flight (the model's ``activations_per_token`` values a token)."""
    check_value("microbatch_size", microbatch_size, ">= 1", integer=True)
    check_value("num_ranks", num_ranks, ">= 1", integer=True)
    tokens = microbatch_size * model.tokens_per_sample
    return 16.0 * model.num_parameters + 4.0 * num_ranks * tokens * model.activations_per_token


FLOPS_PER_S = 1e9
"""What a time estimate takes one rank to do: a slow CPU thread's fp32 multiply-adds x 2."""
OP_OVERHEAD_S = 1e-3
"""The runtime's own cost per scheduled action (sends, waits, bookkeeping: 0.2-1 ms here)."""


def train_seconds(
    num_parameters: int, tokens: int, *, num_ranks: int, num_microbatches: int, steps: int
) -> float:
    """About how long ``steps`` training steps of a model of ``num_parameters`` parameters
    take on ``num_ranks`` ranks, each step ``num_microbatches`` microbatches of ``tokens``
    tokens (or rows): forward and backward cost 6 FLOPs a parameter and token at
    :data:`FLOPS_PER_S`, and every microbatch 3 actions on each rank at
    :data:`OP_OVERHEAD_S`. Raises ValueError for a negative size or a count below 1."""
    for name, value in (("num_ranks", num_ranks), ("num_microbatches", num_microbatches),
                        ("steps", steps)):  # fmt: skip
        check_value(name, value, ">= 1", integer=True)
    compute_s = _compute_seconds(num_parameters, tokens)
    return steps * num_microbatches * (compute_s + 3 * num_ranks * OP_OVERHEAD_S)


def profile_seconds(num_parameters: int, tokens: int, *, repeats: int) -> float:
    """About how long the profiler (:func:`~nobubble.pipeline.runtime.profile.profile_stages`)
    takes on a model of ``num_parameters`` parameters and microbatches of ``tokens`` tokens (or
    rows): after one warm-up, each of ``repeats`` runs one microbatch forward, split backward
    and fused backward (twice :func:`train_seconds`'s compute, 4 actions). Raises ValueError
    for a negative size or ``repeats`` below 1."""
    check_value("repeats", repeats, ">= 1", integer=True)
    compute_s = _compute_seconds(num_parameters, tokens)
    return (repeats + 1) * (2 * compute_s + 4 * OP_OVERHEAD_S)


def _compute_seconds(num_parameters: int, tokens: int) -> float:
    """One microbatch forward and backward: 6 FLOPs a parameter and token."""
    check_value("num_parameters", num_parameters, ">= 0", integer=True)
    check_value("tokens", tokens, ">= 0", integer=True)
    return 6.0 * num_parameters * tokens / FLOPS_PER_S


def build_blocks(
    config: ModelConfig, indices: range | None = None, device: torch.device | str = "cpu"
) -> nn.ModuleDict:
    """Build the blocks ``indices`` (default: all), keyed by their global index as a string.

    Each block is initialised from ``(config.seed, index)`` alone, so any subset equals the
    same blocks of the full model.
    """
    import torch
    from torch import nn

    indices = range(config.num_blocks) if indices is None else indices
    blocks = nn.ModuleDict()
    for i in indices:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed * 1_000_003 + i)
            blocks[str(i)] = config.build_block(i)
    return blocks.to(device)


def partition_blocks(config: ModelConfig, num_stages: int) -> tuple[range, ...]:
    """Contiguous block ranges, one per stage, balancing the weighted (transformer) blocks.

    The weighted blocks are cut by :func:`~nobubble.pipeline.partition.equal_sizes` (the
    first stages one more when it does not divide); the weight-0 blocks (embedding, head)
    join the first / last stage. Raises ValueError when the model has fewer weighted blocks
    than stages.
    """
    weighted = [i for i in range(config.num_blocks) if config.block_weight(i) > 0]
    if num_stages < 1:
        raise ValueError(f"num_stages={num_stages} must be >= 1")
    if len(weighted) < num_stages:
        raise ValueError(
            f"the {config.name} model has {len(weighted)} layers but the schedule has "
            f"{num_stages} stages; use at least {num_stages} layers (--layers) or fewer stages"
        )
    assert weighted == list(range(weighted[0], weighted[-1] + 1))  # one run: the body
    sizes = list(equal_sizes(len(weighted), num_stages))  # the weighted blocks' cut
    sizes[0] += weighted[0]  # the weight-0 blocks before them join the first stage
    sizes[-1] += config.num_blocks - 1 - weighted[-1]  # those after them, the last
    return stage_ranges(sizes)
