"""Three models as users write them, each a factory for the planner and ``pp plan --model``.

Each factory returns ``(blocks, inputs, targets, loss_fn)``: the model as a list of blocks
(one tensor in, one tensor out), one step's batch and the loss. Plan one with::

    nobubble pp plan --model examples/plan_models.py:llama --ranks 2

- :func:`transformer`: torch's own modules - an embedding, ``TransformerEncoderLayer`` s, a
  final ``LayerNorm`` and the vocabulary head;
- :func:`llama`: a Hugging Face Llama built from a config (no download) with a 32k
  vocabulary: the embedding holds many parameters and little compute, the head costs
  several layers (needs the ``hf`` extra);
- :func:`uneven`: an MLP whose layers widen toward the output, so that a few layers hold
  most of the compute.

Every factory seeds torch itself, so each rank that calls it builds the same weights and
the same batch.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["transformer", "llama", "uneven"]


def _lm_loss(vocab: int):
    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return loss_fn


def _tokens(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1))
    return ids[:, :-1], ids[:, 1:]


def transformer(
    layers: int = 4, hidden: int = 512, vocab: int = 2048, batch: int = 16, seq: int = 32,
    wider: int | None = None,
):  # fmt: skip
    """Embedding, ``layers`` encoder layers (causal), LayerNorm, head: ``layers + 3`` blocks.

    ``wider``: the index of one layer whose feed-forward is 3x wider (a model whose costs
    changed)."""
    torch.manual_seed(0)
    body = []
    for i in range(layers):
        ffn = 4 * hidden * (3 if i == wider else 1)
        body.append(_Causal(nn.TransformerEncoderLayer(hidden, 8, ffn, dropout=0.0,
                                                       batch_first=True)))  # fmt: skip
    blocks = [nn.Embedding(vocab, hidden), *body, nn.LayerNorm(hidden), nn.Linear(hidden, vocab)]
    return (blocks, *_tokens(vocab, batch, seq), _lm_loss(vocab))


class _Causal(nn.Module):
    """An encoder layer with the causal mask a language model needs: one tensor in, one out."""

    def __init__(self, layer: nn.TransformerEncoderLayer) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.layer(x, src_mask=mask, is_causal=True)


def llama(
    layers: int = 8, hidden: int = 512, vocab: int = 32000, batch: int = 8, seq: int = 32
):  # fmt: skip
    """A Hugging Face ``LlamaForCausalLM`` from a config, as blocks: the token embedding,
    each decoder layer (with its rotary embedding), the final norm, the head."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:  # pragma: no cover - the hf extra is missing
        raise SystemExit("llama: needs the hf extra: pip install 'nobubble[hf]'") from e
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 8 / 3) // 8 * 8,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=max(seq, 128), tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"  # causal without a mask
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    rotary = model.model.rotary_emb
    body = [_LlamaLayer(layer, rotary) for layer in model.model.layers]
    blocks = [model.model.embed_tokens, *body, model.model.norm, model.lm_head]
    return (blocks, *_tokens(vocab, batch, seq), _lm_loss(vocab))


class _LlamaLayer(nn.Module):
    """One decoder layer that computes its own rotary position embedding."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self._rotary = [rotary]  # shared, parameterless: not registered in every block

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        cos_sin = self._rotary[0](x, positions)
        return self.layer(x, position_embeddings=cos_sin, position_ids=positions)


def uneven(widths: tuple[int, ...] = (64, 128, 256, 512, 1024, 1024), classes: int = 10,
           batch: int = 2048):  # fmt: skip
    """An MLP whose layers widen: Linear + GELU blocks ``widths[i] -> widths[i + 1]``, then a
    classifier head; the widest layers hold most of the compute."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(a, b), nn.GELU())
                               for a, b in zip(widths, widths[1:], strict=False)]  # fmt: skip
    blocks.append(nn.Linear(widths[-1], classes))
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch, widths[0], generator=gen)
    targets = torch.randint(0, classes, (batch,), generator=gen)
    return blocks, inputs, targets, nn.functional.cross_entropy
