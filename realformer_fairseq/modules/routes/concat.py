"""The concat route of residual attention (RealFormer, arXiv 2012.11747): one fused attention
over the chain's concatenated queries and keys, never a ``T x T`` stream where it runs.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .eager import Attended, Carried, Heads, RealformerMultiheadAttention
from .rules import ConcatRule, rule_for_this_machine

# torch's SDPBackend numbering, as torch._fused_sdp_choice returns it
_SDPA_KERNELS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


class ConcatRealformerMultiheadAttention(RealformerMultiheadAttention):
    """The same residual attention, computed without the score stream where it pays.

    Layer ``l``'s softmax input is ``S_l = sum_{i<=l} Q_i K_i^T / sqrt(d)`` (divided by
    ``l + 1`` for the running mean), which is ``[Q_0 .. Q_l] [K_0 .. K_l]^T / sqrt(d)``: one
    attention over the queries and keys of this and all earlier layers of the chain,
    concatenated along the head dimension. So ``softmax(S_l + mask) V_l`` is
    ``F.scaled_dot_product_attention(cat(Q_0..Q_l), cat(K_0..K_l), V_l, scale=1 [/(l+1)])``,
    which runs in PyTorch's fused kernels and never forms a ``T x T`` tensor. Its ``q k``
    part is ``l + 1`` times wider than one layer's, so it pays at long lengths and shallow
    depth; with ``residual_attention_impl="auto"`` the layers a measured rule names run fused
    (:mod:`~.rules`; ``auto`` builds this class only on a
    machine such a rule matches, the plain eager module elsewhere).

    A chain is in one of two phases, carried from layer to layer by what ``forward`` returns:

    * **concat**: ``attn_queries`` / ``attn_keys`` are the chain's concatenated scaled
      queries ``(bsz*heads, tgt_len, (l+1)*head_dim)`` and keys ``(kv_bsz*heads, src_len,
      (l+1)*head_dim)``; ``attn_scores`` is None. The stream they stand for is
      ``stream_of(attn_queries, attn_keys)``.
    * **eager**: from the first layer that cannot or should not run fused (``need_weights``,
      attention dropout on CPU, a mask that needs a gradient, no fused kernel for the shapes,
      or ``auto`` finding eager faster), the stream is formed once from the concatenated
      parts, in the eager route's order and dtype (per layer product, float32 at least, added
      in layer order), and the chain continues exactly as the eager route: ``attn_scores``
      is the stream, the queries and keys are None.

    Every switch of kernel is logged at debug level (``realformer_fairseq.modules.
    routes.concat``), with the reason; with an explicit ``concat``, a reason that keeps
    a call from fusing is also logged once per process at WARNING. Masks are additive float
    masks with the eager route's finite fill. A row whose keys are all masked (a fully padded
    sequence) yields the mean of the values, as in the eager route, on every kernel: the
    module sets such rows itself after the fused call (in fp16, whose fill cannot absorb the
    scores, the kernel alone would give the softmax of the scores; a kernel that treats a fill
    as -inf would give zeros). With attention dropout on CUDA the fused kernel draws its own
    dropout mask (the same distribution as the eager route's, not the same draw).
    """

    @classmethod
    def route_help(cls, name: str) -> str:
        if name == "auto":
            return (
                "(the default) runs concat only where a measured rule for this machine's GPU "
                "says it wins (today: the first 4 layers of self-attention chains on keys of "
                "2048+ tokens, fp16/bf16, NVIDIA H200 with torch 2.11) and builds the eager "
                "route everywhere else"
            )
        return (
            "runs one fused attention over the concatenated queries and keys of this and all "
            "earlier layers of the chain (no T x T tensor, falls back to eager where no fused "
            "kernel serves the call, with one warning)"
        )

    @classmethod
    def for_chain(
        cls, name: str, requested: str, chain: str, cpu: bool, embed_dim, num_heads,
        residual_attention_mode: str, **kwargs,
    ):  # fmt: skip
        rule = rule_for_this_machine(chain, cpu) if name == "auto" else None
        return cls(
            embed_dim, num_heads, residual_attention_mode, residual_attention_impl=name,
            rule=rule, **kwargs,
        )  # fmt: skip

    def __init__(
        self,
        embed_dim,
        num_heads,
        residual_attention_mode: str,
        residual_attention_impl: str = "concat",
        rule: Optional[ConcatRule] = None,
        **kwargs,
    ):
        if residual_attention_impl not in ("concat", "auto"):
            raise ValueError(
                "ConcatRealformerMultiheadAttention computes the 'concat' and 'auto' routes, "
                f"got {residual_attention_impl!r} (the eager route is RealformerMultiheadAttention)"
            )
        if (residual_attention_impl == "auto") != (rule is not None):
            raise ValueError("the auto route needs its measured rule, the concat route none")
        super().__init__(embed_dim, num_heads, residual_attention_mode, **kwargs)
        self.residual_attention_impl = residual_attention_impl
        self.fp16_mask_value = float(torch.finfo(torch.float16).min)
        # auto's rule (rules.ConcatRule) as plain attributes, for TorchScript: the
        # first ``auto_depth`` layers of the chain run fused on CUDA in the measured dtypes,
        # on keys at least ``auto_min_length`` long
        self.auto_depth = rule.depth if rule is not None else 0
        self.auto_min_length = rule.min_length if rule is not None else 0
        self.auto_fp16 = rule is not None and torch.float16 in rule.dtypes
        self.auto_bf16 = rule is not None and torch.bfloat16 in rule.dtypes
        self.auto_float32 = rule is not None and torch.float32 in rule.dtypes

    def carries_queries(self) -> bool:
        return True

    def why_not(
        self,
        heads: Heads,
        carried: Carried,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
    ) -> Optional[str]:
        """Why this call cannot run fused (None where it may: :meth:`attend` then asks torch for
        a fused kernel, and runs the chain's eager phase where the stream is formed)."""
        if heads.prev_attn_scores is not None:
            return None
        return self._why_not_fused(
            heads.q, heads.bsz, heads.kv_bsz, heads.k.size(1), heads.layer_idx,
            heads.need_weights, heads.attn_mask, self._dropout_p(),
        )  # fmt: skip

    def attend(self, heads: Heads, carried: Carried) -> Attended:
        """``(attn, attn_weights, attn_scores, attn_queries, attn_keys)``: either
        ``attn_scores`` (eager phase) or ``attn_queries`` and ``attn_keys`` (concat phase) set."""
        if heads.prev_attn_scores is not None:  # the chain is in its eager phase
            if not torch.jit.is_scripting():
                self._last_route[0] = "eager, the chain's stream"
            return self._eager_route(heads, self.one_stream_per_chain)
        queries, keys = self._concatenated(heads, carried)
        q, v, layer_idx = heads.q, heads.v, heads.layer_idx
        bsz, kv_bsz, tgt_len, src_len = heads.bsz, heads.kv_bsz, q.size(1), heads.k.size(1)
        dropout_p = self._dropout_p()
        fill = self.mask_value
        if q.dtype == torch.float16:
            fill = self.fp16_mask_value
        mask = self._additive_mask(
            heads.key_padding_mask, heads.attn_mask, kv_bsz, tgt_len, src_len, q, fill
        )
        q4, k4, v4 = self._heads_first(queries, keys, v, bsz, kv_bsz, tgt_len)
        scale = 1.0 / float(layer_idx + 1) if self.residual_attention_mode == "mean" else 1.0
        kernel = torch._fused_sdp_choice(q4, k4, v4, mask, dropout_p, False, scale=scale)
        if kernel <= 0 and v4.size(-1) != q4.size(-1):
            # kernels that need one head size for q, k and v (flash; all of them on CPU):
            # zeros in front of the values, whose share of the output is then dropped
            v4 = F.pad(v4, (q4.size(-1) - v4.size(-1), 0))
            kernel = torch._fused_sdp_choice(q4, k4, v4, mask, dropout_p, False, scale=scale)
        if kernel <= 0:
            if not torch.jit.is_scripting():
                self._fell_back(
                    "no fused kernel for these shapes and dtype (SDPA would use math)", layer_idx
                )
            return self._eager_of_parts(heads, queries, keys)

        if not torch.jit.is_scripting():
            self._took_kernel(kernel, layer_idx)
        out = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
        head_dim = v.size(-1)
        out = out[..., out.size(-1) - head_dim :]
        if mask is not None:
            out = self._fully_masked_rows_as_eager(
                out, mask, fill, v4[..., v4.size(-1) - head_dim :]
            )
        attn = self._heads_back(out, bsz, kv_bsz, tgt_len)
        return self._merge_heads(attn, tgt_len, bsz), None, None, queries, keys

    def fall_back(self, heads: Heads, carried: Carried) -> Attended:
        """The eager route from the chain's concatenated parts: the stream formed once."""
        queries, keys = self._concatenated(heads, carried)
        return self._eager_of_parts(heads, queries, keys)

    def _concatenated(self, heads: Heads, carried: Carried) -> Tuple[Tensor, Tensor]:
        """The chain's queries and keys with this layer's appended."""
        queries, keys = heads.q, heads.k
        prev_queries, prev_keys = carried.queries, carried.keys  # locals: TorchScript refines them
        if prev_queries is not None:
            queries = torch.cat([prev_queries, queries], dim=-1)
        if prev_keys is not None:
            keys = torch.cat([prev_keys, keys], dim=-1)
        return queries, keys

    def _eager_of_parts(self, heads: Heads, queries: Tensor, keys: Tensor) -> Attended:
        raw_scores, attn_scores = self._stream_of_parts(
            queries, keys, heads.q, heads.k, heads.bsz, heads.kv_bsz
        )
        attn, attn_weights = self._attend_stream(
            attn_scores, raw_scores, heads.v, heads.key_padding_mask, heads.attn_mask, heads.bsz,
            heads.kv_bsz, heads.layer_idx, heads.need_weights, heads.need_head_weights,
        )  # fmt: skip
        return attn, attn_weights, attn_scores, None, None

    def _dropout_p(self) -> float:
        """The attention dropout of this call (0 where fairseq's dropout would not drop)."""
        if self.training or self.dropout_module.apply_during_inference:
            return self.dropout_module.p
        return 0.0

    @torch.jit.unused
    def _took_kernel(self, kernel: int, layer_idx: int):
        """Record torch's SDPA backend ``kernel`` as what this call ran."""
        self._took(f"fused SDPA, {_SDPA_KERNELS[kernel]}", layer_idx)

    @torch.jit.unused
    def says_fallbacks(self) -> bool:
        return self.residual_attention_impl == "concat"  # auto falls back by design

    @property
    def last_kernel(self) -> str:
        """The former name of :attr:`last_route` (on the routes that record one)."""
        return self._last_route[0]

    def _fully_masked_rows_as_eager(
        self, out: Tensor, mask: Tensor, fill: float, v4: Tensor
    ) -> Tensor:
        """Rows whose keys are all masked get the eager route's result, the uniform average of
        the values ``v4`` ``(batch, heads, src_len, head_dim)``, whatever the kernel made of
        them (see the class docstring); ``out`` is ``(batch, heads, tgt_len, head_dim)``."""
        fully_masked = (mask <= fill).all(dim=-1, keepdim=True)
        return torch.where(fully_masked, v4.mean(-2, True), out)

    def auto_runs_fused(self, layer_idx: int, src_len: int, q: Tensor) -> bool:
        """``auto``'s measured rule (:mod:`~.rules`): layer
        ``layer_idx`` runs fused on CUDA, in a measured dtype, on keys at least
        ``auto_min_length`` long, for the first ``auto_depth`` layers of the chain."""
        if q.device.type != "cuda" or layer_idx >= self.auto_depth:
            return False
        if src_len < self.auto_min_length:
            return False
        if q.dtype == torch.float16:
            return self.auto_fp16
        if q.dtype == torch.bfloat16:
            return self.auto_bf16
        return q.dtype == torch.float32 and self.auto_float32

    def _why_not_fused(
        self,
        q: Tensor,
        bsz: int,
        kv_bsz: int,
        src_len: int,
        layer_idx: int,
        need_weights: bool,
        attn_mask: Optional[Tensor],
        dropout_p: float,
    ) -> Optional[str]:
        """Why this call runs the eager route (None where the fused attention may run)."""
        if need_weights:
            return "the attention probabilities are asked for (need_weights)"
        if dropout_p > 0.0 and q.device.type == "cpu":
            return "attention dropout on CPU (no fused CPU kernel draws it)"
        if attn_mask is not None and attn_mask.requires_grad:
            return "the attention mask needs a gradient"
        if attn_mask is not None and bsz != kv_bsz:
            return "an attention mask with keys shared by the beams"
        if self.residual_attention_impl == "auto" and not self.auto_runs_fused(
            layer_idx, src_len, q
        ):
            return "auto: its measured rule runs the eager route here"
        return None

    def _additive_mask(
        self,
        key_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor],
        kv_bsz: int,
        tgt_len: int,
        src_len: int,
        q: Tensor,
        fill: float,
    ) -> Optional[Tensor]:
        """The eager route's masks as one additive mask in ``q``'s dtype, broadcastable to
        ``(kv_bsz, heads, tgt_len, src_len)``: the attention mask clamped at ``fill``, and
        ``fill`` at padded keys (the eager route's finite fill; fp16's own minimum in fp16)."""
        mask: Optional[Tensor] = None
        if attn_mask is not None:
            mask = attn_mask.to(q.dtype).clamp(min=fill).view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            padding = key_padding_mask.view(kv_bsz, 1, 1, src_len).to(torch.bool)
            if mask is None:
                mask = torch.zeros(
                    (kv_bsz, 1, 1, src_len), dtype=q.dtype, device=q.device
                ).masked_fill(padding, fill)
            else:
                mask = mask.masked_fill(padding, fill)
        return mask

    def _heads_first(
        self, queries: Tensor, keys: Tensor, v: Tensor, bsz: int, kv_bsz: int, tgt_len: int
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """``(batch, heads, len, dim)`` views for SDPA; where the beams of a sentence share
        its keys, their queries are laid out one after another along the query axis."""
        width = queries.size(-1)
        k4 = keys.view(kv_bsz, self.num_heads, -1, width)
        v4 = v.view(kv_bsz, self.num_heads, -1, v.size(-1))
        if bsz != kv_bsz:
            q4 = queries.view(kv_bsz, -1, self.num_heads, tgt_len, width).transpose(1, 2)
            q4 = q4.reshape(kv_bsz, self.num_heads, -1, width)
        else:
            q4 = queries.view(bsz, self.num_heads, tgt_len, width)
        return q4, k4, v4

    def _heads_back(self, out: Tensor, bsz: int, kv_bsz: int, tgt_len: int) -> Tensor:
        """SDPA's output back to ``(bsz*heads, tgt_len, head_dim)``."""
        head_dim = out.size(-1)
        if bsz != kv_bsz:
            out = out.reshape(kv_bsz, self.num_heads, -1, tgt_len, head_dim).transpose(1, 2)
        return out.reshape(bsz * self.num_heads, tgt_len, head_dim)

    def _stream_of_parts(
        self, queries: Tensor, keys: Tensor, q: Tensor, k: Tensor, bsz: int, kv_bsz: int
    ) -> Tuple[Tensor, Tensor]:
        """This layer's raw scores and the stream ``queries keys^T``, computed as the eager
        route computes it: each layer's product (its own head-size slice), at least float32,
        added in layer order."""
        stream: Optional[Tensor] = None
        d = self.head_dim
        for i in range(queries.size(-1) // d - 1):
            raw = self.raw_scores(
                queries[:, :, i * d : (i + 1) * d], keys[:, :, i * d : (i + 1) * d], bsz, kv_bsz
            )
            stream = self.add_to_stream(raw, stream)
        raw_scores = self.raw_scores(q, k, bsz, kv_bsz)
        return raw_scores, self.add_to_stream(raw_scores, stream)


def stream_of(attn_queries: Tensor, attn_keys: Tensor) -> Tensor:
    """The stream a concat-phase chain stands for, ``(bsz*heads, tgt_len, src_len)``: the
    running sum of the scaled raw scores of every layer so far (float64 in, float64 out).
    For tests and tools; the module itself never forms it in the concat phase."""
    return torch.bmm(attn_queries, attn_keys.transpose(1, 2))
