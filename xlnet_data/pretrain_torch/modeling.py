"""XLNet for permutation-LM pretraining in PyTorch, numerically the original's (and our TF2 pretrain/modeling.py's).

Its `state_dict()` keys are Hugging Face's `XLNetLMHeadModel`'s (transformer.word_embedding.weight,
transformer.layer.N.rel_attn.q, ..., lm_loss.bias; lm_loss.weight is the embedding, tied), so a safetensors file
of it beside pretrain/hf.py's config.json is a Transformers model. With untie_r=False the attention biases are one
parameter shared by every layer (listed under each layer's name, as Transformers keeps them).

    model = XLNet(XLNetConfig(...), RunConfig(mem_len=384, reuse_len=256, bi_data=True))
    init_weights(model, run, torch.Generator().manual_seed(0))   # train_gpu's initialisers
    mems = model.initial_mems(bsz)
    out = model(features, mems)       # out.loss, out.token_loss [bsz, num_predict], out.new_mems
    mems = out.new_mems               # feed to the next batch of the same rows

Features are batch-major as pretrain/inputs.py makes them; memories time-major ([mem_len, bsz, d_model], one per
layer) as the original's. Inside, activations are batch-major and heads head-major ([bsz, n_head, len, d_head]):
every product is a plain batched matmul and the softmax runs over the last axis.

Unlike the original and Transformers, the query stream attends from the predicted positions only (target_mapping's
rows), not from every position: the same numbers for one-hot rows (and zero for padding rows), num_predict/seq_len
of the work. Under `torch.autocast(dtype=torch.bfloat16)` the matmuls run in bfloat16, the attention softmax, the
layer norms and the loss in float32. `recompute=True`: each layer's activations recomputed in the backward pass
(torch.utils.checkpoint, which replays the layer's dropout masks). No data-dependent Python branch runs in the step,
so torch.compile traces it whole.

`attention="flex"`: both streams' attention through FlexAttention (torch.nn.attention.flex_attention), one fused
kernel per stream on a GPU (compiled to Triton) instead of the scores, the shift, the masks and the softmax as separate
tensors: the content term is the kernel's own q.k (queries + r_w_bias), and its score_mod adds the other two as
lookups by (row, query, key): the position term from the unshifted scores against the relative positions (the shift
is the lookup's index), the segment term from the two scores per query by whether the key is in another segment; the
mask subtracts 1e30 as the eager path does (a fully masked row gets uniform weights, as the original's). Memories are
the first mlen keys. No dropout of the attention weights (FlexAttention has none): dropatt must be 0. torch has no
FlexAttention backward on the CPU (training with it needs a GPU); its forward runs there, unfused.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import flex_attention
from torch.utils.checkpoint import checkpoint

from xlnet_data.common.errors import ConfigError
from xlnet_data.pretrain.config import LAYER_NORM_EPSILON, RunConfig, XLNetConfig, check_attention

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class PLMOutput(NamedTuple):
    loss: Tensor                 # scalar float32: sum(token_loss * target_mask) / sum(target_mask)
    token_loss: Tensor           # [bsz, num_predict] float32, unmasked
    new_mems: Optional[list]     # per layer [mem_len, bsz, d_model], detached; None when mem_len == 0
    hidden: Tensor               # [bsz, num_predict, d_model]: the query stream's output (XLNet.logits gives its logits)


def _at_least_float32(x: Tensor) -> Tensor:
    """x in float32 when it is bfloat16 (autocast), else as it is (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gelu(x: Tensor) -> Tensor:
    """The original's GELU: the tanh approximation (Transformers' "gelu_new")."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


class RelativeAttention(nn.Module):
    """One layer's two-stream relative attention (Transformers' XLNetRelativeAttention's parameters). The biases
    are passed in: with untie_r=False every layer holds the same three."""

    def __init__(self, model: XLNetConfig, biases: Optional[tuple[nn.Parameter, ...]]):
        super().__init__()
        d, n, h = model.d_model, model.n_head, model.d_head
        for name in "qkvor":
            setattr(self, name, nn.Parameter(torch.empty(d, n, h)))
        r_r_bias, r_s_bias, r_w_bias = biases or (nn.Parameter(torch.empty(n, h)) for _ in range(3))
        self.r_r_bias, self.r_s_bias, self.r_w_bias = r_r_bias, r_s_bias, r_w_bias
        self.seg_embed = nn.Parameter(torch.empty(2, n, h))
        self.layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPSILON)


class FeedForward(nn.Module):
    def __init__(self, model: XLNetConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(model.d_model, eps=LAYER_NORM_EPSILON)
        self.layer_1 = nn.Linear(model.d_model, model.d_inner)
        self.layer_2 = nn.Linear(model.d_inner, model.d_model)


class Layer(nn.Module):
    def __init__(self, model: XLNetConfig, biases: Optional[tuple[nn.Parameter, ...]]):
        super().__init__()
        self.rel_attn = RelativeAttention(model, biases)
        self.ff = FeedForward(model)


class Transformer(nn.Module):
    """Transformers' XLNetModel's parameters."""

    def __init__(self, model: XLNetConfig):
        super().__init__()
        self.word_embedding = nn.Embedding(model.n_token, model.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, model.d_model))
        shared = None
        if not model.untie_r:
            shared = tuple(nn.Parameter(torch.empty(model.n_head, model.d_head)) for _ in range(3))
        self.layer = nn.ModuleList(Layer(model, shared) for _ in range(model.n_layer))


def _heads(x: Tensor, kernel: Tensor) -> Tensor:
    """x [bsz, len, d_model] x kernel [d_model, n_head, d_head] -> [bsz, n_head, len, d_head], as one 2-D matmul."""
    d_model, n_head, d_head = kernel.shape
    out = torch.matmul(x, kernel.reshape(d_model, n_head * d_head))
    return out.unflatten(-1, (n_head, d_head)).transpose(-3, -2)


def _rel_shift(x: Tensor, klen: int) -> Tensor:
    """[..., qlen, rlen] scores against relative positions -> [..., qlen, klen] against keys (the original's)."""
    *lead, qlen, rlen = x.shape
    x = x.reshape(*lead, rlen, qlen)[..., 1:, :]
    return x.reshape(*lead, qlen, rlen - 1)[..., :klen]


def _rel_shift_rows(x: Tensor, positions: Tensor, klen: int) -> Tensor:
    """_rel_shift for the queries at `positions` [bsz, num_predict] of a sequence of qlen = rlen - klen:
    x [bsz, n_head, num_predict, rlen] -> [bsz, n_head, num_predict, klen]. Query p against key j is relative
    position column qlen - p + j (never past rlen with attn_type "bi")."""
    qlen = x.shape[-1] - klen
    columns = (qlen - positions)[:, None, :, None] + torch.arange(klen, device=x.device)
    return torch.gather(x, -1, columns.expand(*x.shape[:-1], klen))


def _position_scores(attn: RelativeAttention, q_head: Tensor, k_head_r: Tensor) -> Tensor:
    """The position term before the shift: (q_head + r_r_bias) against the relative positions' keys, [bsz, n_head,
    len(q_head), rlen]; with bi_data the forward half of the batch against direction 0, the backward half against 1."""
    q_r = q_head + attn.r_r_bias[:, None]
    if k_head_r.shape[0] == 1:
        return torch.matmul(q_r, k_head_r[0].transpose(-1, -2))
    return torch.matmul(q_r.unflatten(0, (2, -1)), k_head_r[:, None].transpose(-1, -2)).flatten(0, 1)


def _segment_scores(attn: RelativeAttention, q_head: Tensor) -> Tensor:
    """The segment term's two scores per query, [..., len(q_head), 2]: against the same segment, another."""
    return torch.matmul(q_head + attn.r_s_bias[:, None], attn.seg_embed.permute(1, 2, 0))


_compiled_flex = None


def _flex(query: Tensor, key: Tensor, value: Tensor, score_mod, scale: float) -> Tensor:
    """flex_attention, compiled on a GPU where the caller is not (compiled, it is one fused kernel; eager, torch's
    unfused reference, which is what runs on the CPU)."""
    global _compiled_flex
    if query.is_cuda and not torch.compiler.is_compiling():
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex(query, key, value, score_mod=score_mod, scale=scale)
    return flex_attention(query, key, value, score_mod=score_mod, scale=scale)


def _rows_at(mask: Tensor, positions: Tensor) -> Tensor:
    """Rows `positions` [bsz, num_predict] of a [bsz or 1, 1, qlen, klen] mask: [bsz, 1, num_predict, klen]."""
    bsz, num_predict = positions.shape
    mask = mask.expand(bsz, 1, *mask.shape[2:])
    return torch.gather(mask, 2, positions[:, None, :, None].expand(bsz, 1, num_predict, mask.shape[-1]))


def relative_positional_encoding(qlen: int, klen: int, d_model: int, run: RunConfig, device, dtype) -> Tensor:
    """Sinusoids of the relative distances klen, klen-1, ... ([n_dir, rlen, d_model]); n_dir is 2 with bi_data:
    [0] for the forward rows (the first half of the batch), [1] for the backward rows (negated distances)."""
    freq_seq = torch.arange(0, d_model, 2.0, device=device, dtype=dtype)
    inv_freq = 1 / (10000 ** (freq_seq / d_model))
    end = -qlen if run.attn_type == "bi" else -1

    def embed(begin, stop, step):
        pos_seq = torch.arange(begin, stop, step, device=device, dtype=dtype)
        if run.clamp_len > 0:
            pos_seq = pos_seq.clamp(-run.clamp_len, run.clamp_len)
        sinusoid = pos_seq[:, None] * inv_freq
        return torch.cat([torch.sin(sinusoid), torch.cos(sinusoid)], -1)

    directions = [embed(klen, end, -1)]
    if run.bi_data:
        directions.append(embed(-klen, -end, 1))
    return torch.stack(directions)


def attention_masks(perm_mask: Optional[Tensor], qlen: int, mlen: int, run: RunConfig, dtype):
    """(attn_mask, non_tgt_mask) of the query and the content stream, [bsz or 1, 1, qlen, klen] (1 = may not
    attend), or (None, None) when nothing is masked. perm_mask [bsz, qlen, qlen] (1: i may not attend to j)."""
    attn_mask = None
    if run.attn_type == "uni":
        ones = torch.ones(qlen, qlen, dtype=dtype, device=perm_mask.device if perm_mask is not None else None)
        causal = torch.cat([torch.zeros(qlen, mlen, dtype=dtype, device=ones.device), ones.triu(1)], 1)
        if run.same_length:  # as the original: it edits the first qlen columns, memory when mlen > 0
            causal = torch.cat([causal[:, :qlen] + ones.tril(-1), causal[:, qlen:]], 1)
        attn_mask = causal[None, None]
    if perm_mask is not None:
        data_mask = perm_mask.to(dtype)
        # Memories can always be attended to.
        data_mask = F.pad(data_mask, (mlen, 0))[:, None]
        attn_mask = data_mask if attn_mask is None else attn_mask + data_mask
    if attn_mask is None:
        return None, None
    attn_mask = (attn_mask > 0).to(dtype)
    # The content stream may see its own position; the query stream may not.
    own = F.pad(torch.eye(qlen, dtype=dtype, device=attn_mask.device), (mlen, 0))
    non_tgt_mask = ((attn_mask - own) > 0).to(dtype)
    return attn_mask, non_tgt_mask


class XLNet(nn.Module):
    """XLNet with the permutation-LM head; parameters named as Transformers' XLNetLMHeadModel's."""

    def __init__(self, model: XLNetConfig, run: RunConfig, recompute: bool = False, attention: str = "eager"):
        super().__init__()
        check_attention(attention, run.dropatt)
        self.config = model
        self.run = run
        self.recompute = recompute
        self.attention = attention
        self.transformer = Transformer(model)
        self.lm_loss = nn.Linear(model.d_model, model.n_token)
        self.lm_loss.weight = self.transformer.word_embedding.weight  # tied, as the original's LM head

    def initial_mems(self, bsz: int, device=None, dtype=torch.float32) -> Optional[list]:
        """Zero memories for the first batch (train_gpu's initialize_mems_np)."""
        if not self.run.mem_len:
            return None
        return [torch.zeros(self.run.mem_len, bsz, self.config.d_model, device=device, dtype=dtype)
                for _ in range(self.config.n_layer)]

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head: hidden [..., d_model] x the tied embedding + lm_loss.bias, in float32 (or float64)."""
        return _at_least_float32(self.lm_loss(hidden))

    # ----- the network -----
    def _dropout(self, x: Tensor, rate: float) -> Tensor:
        return F.dropout(x, rate, self.training) if rate else x

    def _attention(self, attn: RelativeAttention, q_head: Tensor, k_head_h: Tensor, v_head_h: Tensor,
                   k_head_r: Tensor, seg_mat: Optional[Tensor], mask: Optional[Tensor],
                   positions: Optional[Tensor]) -> Tensor:
        """Relative attention of one stream: content + position + segment scores. q_head [bsz, n_head, qlen,
        d_head] (the queries at `positions` [bsz, num_predict] when given), k/v_head_h [bsz, n_head, klen, d_head],
        k_head_r [n_dir, n_head, rlen, d_head], seg_mat [bsz, 1, qlen, klen] (1: other segment), mask [bsz or 1,
        1, qlen, klen] (1: may not attend). Returns [bsz, n_head, len(q_head), d_head]."""
        if self.attention == "flex":
            return self._flex_attention(attn, q_head, k_head_h, v_head_h, k_head_r, seg_mat, mask, positions)
        klen = k_head_h.shape[2]
        ac = torch.matmul(q_head + attn.r_w_bias[:, None], k_head_h.transpose(-1, -2))
        bd = _position_scores(attn, q_head, k_head_r)
        if positions is None:
            bd = _rel_shift(bd, klen)
        else:
            bd = _rel_shift_rows(bd, positions, klen)
            seg_mat = None if seg_mat is None else _rows_at(seg_mat, positions)
            mask = None if mask is None else _rows_at(mask, positions)
        score = ac + bd
        if seg_mat is not None:
            # The original's einsum with a one-hot seg_mat, as same + seg_mat * (other - same).
            ef = _segment_scores(attn, q_head)
            same, other = ef[..., :1], ef[..., 1:]
            score = score + same + seg_mat * (other - same)
        # The softmax (and the masking) in float32 even under bfloat16; 1e30 subtracted, not a fill, as the
        # original: a row with every key masked then gets the original's (uniform) weights.
        score = _at_least_float32(score) * (1 / self.config.d_head ** 0.5)
        if mask is not None:
            score = score - 1e30 * mask
        prob = torch.softmax(score, -1).to(v_head_h.dtype)
        prob = self._dropout(prob, self.run.dropatt)
        return torch.matmul(prob, v_head_h)

    def _flex_attention(self, attn: RelativeAttention, q_head: Tensor, k_head_h: Tensor, v_head_h: Tensor,
                        k_head_r: Tensor, seg_mat: Optional[Tensor], mask: Optional[Tensor],
                        positions: Optional[Tensor]) -> Tensor:
        """_attention's scores, shift, masks and softmax in one FlexAttention call (see the module doc)."""
        bsz, _, nq, _ = q_head.shape
        klen = k_head_h.shape[2]
        scale = 1 / self.config.d_head ** 0.5
        # The unshifted position scores, flattened per head: query row q against key j is entry q * rlen + column
        # (rows - p + j), p the query's position (rows - p + j may pass rlen only with attn_type "uni", where it wraps
        # into the next row exactly as _rel_shift's reshape does, on masked keys).
        # In the matmul's dtype (bfloat16 under autocast: half the bytes); scaled here, not in score_mod, where
        # torch.compile lifts the Python float to a tensor and fails on it under dynamic shapes.
        bd = _position_scores(attn, q_head, k_head_r) * scale
        rlen = bd.shape[-1]
        bd = bd.flatten(2)
        rows = nq if positions is None else rlen - klen
        query_position = (positions if positions is not None
                          else torch.arange(nq, device=q_head.device).expand(bsz, nq))
        first = torch.arange(nq, device=q_head.device) * rlen + rows - query_position  # [bsz, nq]
        ef = other_segment = None
        if seg_mat is not None:
            ef = _at_least_float32(_segment_scores(attn, q_head)) * scale  # [bsz, n_head, nq, 2]
            other_segment = seg_mat.to(torch.int64)
        blind = None
        if mask is not None:
            # A row that may attend to no key: the eager path's scores are all -1e30 there (float32 absorbs the
            # rest), so its weights are uniform. Scores of 0 give the same weights here, and a log-sum-exp the
            # backward pass can use (that of -1e30 + log(klen) is -1e30: weights of 1 each).
            blind = mask.amin(-1)  # [bsz or 1, 1, qlen]
            mask_batch = mask.shape[0] > 1

        def score_mod(score, b, h, q, j):
            p = query_position[b, q]
            score = score + bd[b, h, first[b, q] + j].to(score.dtype)
            if ef is not None:
                score = score + ef[b, h, q, other_segment[b, 0, p, j]]
            if mask is not None:
                row = b if mask_batch else 0
                score = torch.where(blind[row, 0, p] > 0, 0.0, score - 1e30 * mask[row, 0, p, j])
            return score

        dtype = v_head_h.dtype  # the content term's queries as the eager matmul takes them (bfloat16 under autocast)
        query = (q_head + attn.r_w_bias[:, None]).to(dtype)
        return _flex(query, k_head_h.to(dtype), v_head_h, score_mod, scale)

    def _post_attention(self, attn: RelativeAttention, h: Tensor, attn_vec: Tensor) -> Tensor:
        """attn_vec [bsz, n_head, len, d_head] -> [bsz, len, d_model], dropout, residual, layer norm."""
        d_model, n_head, d_head = attn.o.shape
        out = torch.matmul(attn_vec.transpose(1, 2).flatten(2), attn.o.reshape(d_model, n_head * d_head).t())
        return attn.layer_norm(self._dropout(out, self.run.dropout) + h)

    def _ffn(self, ff: FeedForward, x: Tensor) -> Tensor:
        out = ff.layer_1(x)
        out = self._dropout(gelu(out) if self.config.ff_activation == "gelu" else F.relu(out), self.run.dropout)
        out = self._dropout(ff.layer_2(out), self.run.dropout)
        return ff.layer_norm(out + x)

    def _layer(self, layer: Layer, output_h: Tensor, output_g: Optional[Tensor], mem: Optional[Tensor],
               pos_emb: Tensor, seg_mat: Optional[Tensor], attn_mask: Optional[Tensor],
               non_tgt_mask: Optional[Tensor], positions: Optional[Tensor], predicted_weight: Optional[Tensor],
               scatter: Optional[Tensor]):
        """One layer of both streams (output_g None: the content stream only); returns (output_h, output_g).
        The query stream attends from `positions` (weighted by predicted_weight), or with `scatter` (a
        target_mapping, attn_type "uni") as the original: its queries scattered to every position and back."""
        attn = layer.rel_attn
        cat = output_h if mem is None else torch.cat([mem.to(output_h.dtype), output_h], 1)
        k_head_h = _heads(cat, attn.k)
        v_head_h = _heads(cat, attn.v)
        k_head_r = _heads(pos_emb.to(cat.dtype), attn.r)
        attn_vec_h = self._attention(attn, _heads(output_h, attn.q), k_head_h, v_head_h, k_head_r, seg_mat,
                                     non_tgt_mask, None)
        new_h = self._post_attention(attn, output_h, attn_vec_h)
        if output_g is not None:
            q_head_g = _heads(output_g, attn.q)
            if scatter is not None:
                q_head_g = torch.einsum("bnmd,bml->bnld", q_head_g, scatter)
            attn_vec_g = self._attention(attn, q_head_g, k_head_h, v_head_h, k_head_r, seg_mat, attn_mask, positions)
            if scatter is not None:
                attn_vec_g = torch.einsum("bnld,bml->bnmd", attn_vec_g, scatter)
            if predicted_weight is not None:  # zero for target_mapping's padding rows, as the original's einsum
                attn_vec_g = attn_vec_g * predicted_weight[:, None, :, None].to(attn_vec_g.dtype)
            output_g = self._ffn(layer.ff, self._post_attention(attn, output_g, attn_vec_g))
        return self._ffn(layer.ff, new_h), output_g

    def _cache_mem(self, curr_out: Tensor, prev_mem: Optional[Tensor]) -> Optional[Tensor]:
        """Next batch's memory of one layer (time-major): the last mem_len of (old memory + first reuse_len)."""
        if not self.run.mem_len:
            return None
        if self.run.reuse_len:
            curr_out = curr_out[:, :self.run.reuse_len]
        dtype = self.transformer.mask_emb.dtype  # float32 under bfloat16 autocast
        curr_out = curr_out.transpose(0, 1).to(dtype)
        new_mem = curr_out if prev_mem is None else torch.cat([prev_mem.to(dtype), curr_out], 0)
        return new_mem[-self.run.mem_len:].detach()

    def transformer_output(self, input_k: Tensor, seg_id: Optional[Tensor] = None, mems: Optional[list] = None,
                           perm_mask: Optional[Tensor] = None, target_mapping: Optional[Tensor] = None,
                           input_q: Optional[Tensor] = None):
        """The original's transformer_xl, batch-major. input_k, seg_id, input_q [bsz, len]; perm_mask [bsz, len,
        len]; target_mapping [bsz, num_predict, len] (one-hot rows, zero rows pad); mems per layer [mlen, bsz,
        d_model]. input_q (or target_mapping) turns the query stream on. Returns (output, new_mems): the query
        stream's output ([bsz, num_predict or len, d_model]) with it, else the content stream's ([bsz, len,
        d_model])."""
        cfg, run = self.config, self.run
        bsz, qlen = input_k.shape
        if run.bi_data and bsz % 2:
            raise ConfigError(f"bi_data needs an even batch (forward + backward halves), got {bsz}")
        mlen = mems[0].shape[0] if mems is not None else 0
        dtype = self.transformer.mask_emb.dtype
        attn_mask, non_tgt_mask = attention_masks(perm_mask, qlen, mlen, run, dtype)
        word_emb_k = self.transformer.word_embedding(input_k)
        output_h = self._dropout(word_emb_k, run.dropout)

        output_g = positions = predicted_weight = mapping = None
        if target_mapping is not None:
            mapping = target_mapping.to(dtype)
            if run.attn_type == "bi":  # queries at the predicted positions only
                positions, predicted_weight = mapping.argmax(-1), mapping.sum(-1)
            output_g = self.transformer.mask_emb.expand(bsz, mapping.shape[1], -1)
        elif input_q is not None:
            inp_q = input_q.to(dtype)[:, :, None]
            output_g = inp_q * self.transformer.mask_emb + (1 - inp_q) * word_emb_k
        if output_g is not None:
            output_g = self._dropout(output_g, run.dropout)
        scatter = mapping if target_mapping is not None and positions is None else None  # "uni"

        seg_mat = None
        if seg_id is not None:  # 1 where query i and key j (memory counts as segment 0) are in different segments
            cat_ids = F.pad(seg_id, (mlen, 0))
            seg_mat = (seg_id[:, :, None] != cat_ids[:, None, :]).to(dtype)[:, None]

        pos_emb = relative_positional_encoding(qlen, mlen + qlen, cfg.d_model, run, input_k.device, dtype)
        pos_emb = self._dropout(pos_emb, run.dropout)

        new_mems = []
        for i, layer in enumerate(self.transformer.layer):
            mem = None if mems is None else mems[i].transpose(0, 1)
            new_mems.append(self._cache_mem(output_h, None if mems is None else mems[i]))
            args = (layer, output_h, output_g, mem, pos_emb, seg_mat, attn_mask, non_tgt_mask, positions,
                    predicted_weight, scatter)
            if self.recompute and self.training:
                output_h, output_g = checkpoint(self._layer, *args, use_reentrant=False)
            else:
                output_h, output_g = self._layer(*args)
        output = output_g if output_g is not None else output_h
        return self._dropout(output, run.dropout), (new_mems if run.mem_len else None)

    def forward(self, features: dict[str, Tensor], mems: Optional[list] = None) -> PLMOutput:
        """The permutation-LM loss of a batch of input-pipeline features (batch-major), as the original's
        two_stream_loss."""
        hidden, new_mems = self.transformer_output(
            features["input_k"], seg_id=features["seg_id"], mems=mems, perm_mask=features["perm_mask"],
            target_mapping=features.get("target_mapping"), input_q=features["input_q"])
        logits = self.logits(hidden)
        target = features["target"].long()
        token_loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
        target_mask = features["target_mask"].float()
        loss = (token_loss * target_mask).sum() / target_mask.sum()
        return PLMOutput(loss, token_loss, new_mems, hidden)


def _uniform(shape, limit: float, generator: torch.Generator) -> Tensor:
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1).mul_(limit).float()


def init_weights(model: XLNet, run: RunConfig, generator: torch.Generator) -> None:
    """train_gpu's (the original's) initialisers, drawn from `generator` (a CPU one) in a fixed order: biases and
    layer-norm betas 0, gammas 1, mask_emb glorot-uniform (tf.get_variable's default: the original gives it
    none), every other weight normal(0, init_std) or uniform(-init_range, init_range) as run.init says."""
    with torch.no_grad():
        for name, param in model.named_parameters():  # shared (tied) parameters come once
            shape = param.shape
            if name.endswith("layer_norm.weight"):
                value = torch.ones(shape)
            elif name.endswith(("layer_norm.bias", "layer_1.bias", "layer_2.bias")) or name == "lm_loss.bias":
                value = torch.zeros(shape)
            elif name.endswith("mask_emb"):
                value = _uniform(shape, math.sqrt(6.0 / (shape[-2] + shape[-1])), generator)
            elif run.init == "uniform":
                value = _uniform(shape, run.init_range, generator)
            else:
                value = torch.randn(shape, generator=generator) * run.init_std
            param.copy_(value)
