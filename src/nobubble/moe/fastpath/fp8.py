"""FP8 dispatch: e4m3 payload with one float32 scale per 128 channels, dequantised on receipt.

Each 128-channel block is scaled so its largest magnitude maps to 448 (e4m3's maximum); values
and scales travel as one packed uint8 row ``[N, H + 4 * B]``, so any transport carries them
bit for bit. Combine stays in the model's dtype, as in DeepEP.

Shape legend: ``N`` tokens, ``H`` hidden, ``B = ceil(H / 128)`` scale blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import nobubble.moe.fastpath.cpu_kernels as cpu_kernels
from nobubble.moe.handle import DispatchResult

if TYPE_CHECKING:
    from nobubble.moe.buffer import Buffer

__all__ = [
    "FP8_BLOCK",
    "FP8_MAX",
    "Fp8Rows",
    "per_token_cast_to_fp8",
    "per_token_cast_back",
    "pack_fp8",
    "unpack_fp8",
    "fp8_row_bytes",
    "quantize_rows",
    "dequantize_rows",
    "fp8_dispatch",
]

FP8_BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_MIN_AMAX = 1e-4  # an all-zero block gets this amax, so its scale is never 0


@dataclass(frozen=True, eq=False)
class Fp8Rows:
    """Quantised rows.

    Attributes:
        data: ``[N, H]`` float8_e4m3fn values, ``x / scale`` per block.
        scales: ``[N, B]`` float32, one per 128-channel block (the last block may be shorter).
    """

    data: torch.Tensor
    scales: torch.Tensor

    @property
    def hidden(self) -> int:
        return int(self.data.shape[1])


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """``[N, H]`` -> float32 ``[N, B, 128]``, zero-padded on the right."""
    n, h = x.shape
    pad = math.ceil(h / FP8_BLOCK) * FP8_BLOCK - h
    xf = torch.nn.functional.pad(x.float(), (0, pad))  # (N, B * 128)
    return xf.view(n, (h + pad) // FP8_BLOCK, FP8_BLOCK)  # (N, B, 128)


def per_token_cast_to_fp8(x: torch.Tensor) -> Fp8Rows:
    """Quantise ``x [N, H]`` (any floating dtype) to e4m3 with a scale per 128-channel block.

    ``scale = amax(|block|) / 448`` and ``data = round_e4m3(x * 448 / amax)``, as DeepEP's
    ``per_token_cast_to_fp8``; dequantised values are within e4m3's relative rounding
    (2^-4) of the input, plus ``scale * 2^-10`` for values in e4m3's subnormal range.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        desc = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"per_token_cast_to_fp8: x must be a floating [N, H] tensor, got {desc}")
    n, h = x.shape
    blocks = _blocks(x)  # (N, B, 128)
    amax = blocks.abs().amax(dim=2).clamp(min=_MIN_AMAX)  # (N, B)
    data = (blocks * (FP8_MAX / amax).unsqueeze(2)).to(FP8_DTYPE)  # (N, B, 128)
    data = data.view(n, blocks.shape[1] * FP8_BLOCK)[:, :h].contiguous()  # (N, H)
    return Fp8Rows(data, (amax / FP8_MAX).contiguous())


def per_token_cast_back(q: Fp8Rows, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dequantise: ``[N, H]`` in ``dtype`` = ``data * scale`` per block (float32 product)."""
    n, h = q.data.shape
    values = _blocks(q.data)  # (N, B, 128)
    out = (values * q.scales.unsqueeze(2)).view(n, values.shape[1] * FP8_BLOCK)  # (N, B * 128)
    return out[:, :h].to(dtype)


def fp8_row_bytes(hidden: int) -> int:
    """Bytes of one packed FP8 row: ``H`` values + 4 bytes per 128-channel block."""
    return hidden + 4 * math.ceil(hidden / FP8_BLOCK)


def pack_fp8(q: Fp8Rows) -> torch.Tensor:
    """``Fp8Rows`` -> one uint8 payload ``[N, H + 4B]`` (values, then scales' bytes)."""
    n = q.data.shape[0]
    if n == 0:  # empty reductions may carry zero strides, which no byte view accepts
        return torch.empty(0, fp8_row_bytes(q.hidden), dtype=torch.uint8)
    return torch.cat(
        [q.data.view(torch.uint8), q.scales.view(torch.uint8).view(n, 4 * q.scales.shape[1])],
        dim=1,
    )  # (N, H + 4B)


def unpack_fp8(packed: torch.Tensor, hidden: int) -> Fp8Rows:
    """Inverse of :func:`pack_fp8` for rows of ``hidden`` channels."""
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != fp8_row_bytes(hidden):
        raise ValueError(
            f"unpack_fp8: expected uint8 [N, {fp8_row_bytes(hidden)}] for hidden={hidden}, got "
            f"{packed.dtype} {tuple(packed.shape)}"
        )
    data = packed[:, :hidden].contiguous().view(FP8_DTYPE)  # (N, H)
    scales = (
        packed[:, hidden:].clone(memory_format=torch.contiguous_format).view(torch.float32)
    )  # (N, B), fresh: 4-byte aligned
    return Fp8Rows(data, scales)


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """``pack_fp8(per_token_cast_to_fp8(x))`` - in one pass with the C kernel where it covers
    ``x`` (bf16/fp32 on CPU), bit for bit the same bytes (NaN blocks: NaN, as in torch). ``[N, H]`` -> uint8 ``[N, H + 4B]``."""
    if (
        isinstance(x, torch.Tensor)
        and x.dim() == 2
        and x.dtype in cpu_kernels.KERNEL_DTYPES
        and x.device.type == "cpu"
    ):
        x = x.contiguous()
        packed = torch.empty(x.shape[0], fp8_row_bytes(x.shape[1]), dtype=torch.uint8)
        if cpu_kernels.fp8_quantize(x, packed):
            return packed
    return pack_fp8(per_token_cast_to_fp8(x))


def dequantize_rows(packed: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """``per_token_cast_back(unpack_fp8(packed, hidden), dtype)`` - in one pass with the C
    kernel where it covers the case, bit for bit the same values (a NaN stays NaN). -> ``[N, hidden]``."""
    if (
        dtype in cpu_kernels.KERNEL_DTYPES
        and packed.dtype == torch.uint8
        and packed.dim() == 2
        and packed.device.type == "cpu"
    ):
        out = torch.empty(packed.shape[0], hidden, dtype=dtype)
        if cpu_kernels.fp8_dequantize(packed, out):
            return out
    return per_token_cast_back(unpack_fp8(packed, hidden), dtype)


def fp8_dispatch(
    buffer: Buffer,
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    *,
    num_experts: int | None = None,
    dtype: torch.dtype | None = None,
) -> DispatchResult:
    """:meth:`Buffer.dispatch` with an FP8 payload; ``recv_x`` comes back dequantised.

    Args:
        buffer: any :class:`Buffer` (its transport moves the packed uint8 rows).
        x: ``[N, H]`` floating token rows (not differentiated through: FP8 dispatch is for
            the forward pass, as in DeepEP).
        topk_idx, topk_weights, num_experts: as :meth:`Buffer.dispatch`.
        dtype: dtype of the returned ``recv_x`` (default ``x.dtype``).
    Returns:
        A :class:`DispatchResult` whose ``recv_x [M, H]`` is the dequantised payload and whose
        handle serves :meth:`Buffer.combine` in the model dtype.
    """
    packed = quantize_rows(x.detach())  # (N, H + 4B)
    res = buffer.dispatch(packed, topk_idx, topk_weights, num_experts=num_experts)
    recv_x = dequantize_rows(res.recv_x, x.shape[1], dtype or x.dtype)  # (M, H)
    return DispatchResult(
        recv_x,
        res.recv_topk_idx,
        res.recv_topk_weights,
        res.num_recv_tokens_per_expert,
        res.handle,
    )
