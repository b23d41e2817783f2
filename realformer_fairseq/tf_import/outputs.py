"""What a TF run of Google's ``BertModel`` (RealFormer's ``realformer.py``, He et al. 2020, arXiv
2012.11747) and BERT's pre-training heads returns, computed by an imported fairseq model."""

from typing import Dict, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import RealformerConfigError
from .bert_checkpoint import NEXT_SENTENCE_HEAD
from .wordpiece import fairseq_ids_of_bert_vocab


def bert_outputs(
    hub,
    input_ids,
    token_type_ids=None,
    input_mask=None,
    vocab_tokens: Optional[Sequence[str]] = None,
) -> Dict[str, np.ndarray]:
    """Run the imported model of ``hub`` (``RealformerRobertaModel.from_pretrained(OUT_DIR)`` of
    a folder written by ``realformer-import-tf``) on BERT inputs, as the TF model is fed.

    ``input_ids``, ``token_type_ids``, ``input_mask``: integer arrays, batch x length, with ids
    into the BERT ``vocab.txt`` (BERT ids, not fairseq ids); ``input_mask`` 1 for tokens, 0 for
    padding, which must be trailing (fairseq's learned positions count non-padding tokens).
    ``vocab_tokens``: the BERT vocabulary in id order; default: the hub's ``--bpe wordpiece``.

    Returns float32 numpy arrays (values at padding positions are not BERT's: fairseq zeroes
    the embeddings there; compare at ``input_mask == 1``):

    * ``sequence_output`` (B, T, D), ``embedding_output`` (B, T, D), ``all_encoder_layers``
      (L, B, T, D);
    * ``pooled_output`` (B, D): ``tanh(dense(sequence_output[:, 0]))`` (``--bert-pooler``);
    * ``mlm_logits``, ``mlm_log_probs`` (B, T, V): the MLM head at every position, log-softmax
      over the BERT vocabulary, in BERT vocabulary order;
    * ``nsp_logits``, ``nsp_log_probs`` (B, 2): the next-sentence head, where the model has it;
    * with residual attention, ``attention_probs`` and ``attention_stream`` (L, B, heads, T,
      T): the softmax probabilities and the running sum of raw scores that each self-attention
      module returned (fairseq's fused attention of a vanilla model returns only the average
      over heads: left out).
    """
    model = hub.model
    dictionary = hub.task.source_dictionary
    if vocab_tokens is None:
        vocab_tokens = getattr(hub.bpe, "vocab_tokens", None)
        if vocab_tokens is None:
            raise RealformerConfigError(
                "bert_outputs needs the BERT vocabulary: load the hub with --bpe wordpiece "
                "(from_pretrained of a realformer-import-tf folder) or pass vocab_tokens"
            )
    to_fairseq = fairseq_ids_of_bert_vocab(dictionary, vocab_tokens)
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise RealformerConfigError(f"input_ids must be batch x length, got shape {ids.shape}")
    mask = np.ones_like(ids) if input_mask is None else np.asarray(input_mask, dtype=np.int64)
    types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids, np.int64)
    for name, array in (("input_mask", mask), ("token_type_ids", types)):
        if array.shape != ids.shape:
            raise RealformerConfigError(f"{name} {array.shape} and input_ids {ids.shape} differ")
    if not np.isin(mask, (0, 1)).all() or (np.diff(mask, axis=1) > 0).any():
        raise RealformerConfigError("input_mask must be 1s followed by 0s (trailing padding)")
    if ids.min() < 0 or ids.max() >= len(vocab_tokens):
        raise RealformerConfigError(f"input_ids outside the vocabulary of {len(vocab_tokens)}")
    tokens = to_fairseq[ids]
    if (tokens[mask == 1] == dictionary.pad()).any():
        raise RealformerConfigError("a [PAD] id at an input_mask 1 position")
    tokens[mask == 0] = dictionary.pad()

    encoder = model.encoder
    sentence_encoder = encoder.sentence_encoder
    if sentence_encoder.embed_token_types is None:
        if types.any():
            raise RealformerConfigError("token_type_ids given, but the model has no token types")
        type_tensor = None
    else:
        type_tensor = torch.from_numpy(types)

    layers = list(sentence_encoder.layers)
    captured = {"probs": [None] * len(layers), "stream": [None] * len(layers)}
    handles = []
    for idx, layer in enumerate(layers):

        def want_head_weights(module, args, kwargs):
            return args, {**kwargs, "need_weights": True, "need_head_weights": True}

        def keep(module, args, kwargs, output, idx=idx):
            captured["probs"][idx] = output[1]  # heads x bsz x tgt x src
            if len(output) > 2:
                captured["stream"][idx] = output[2]  # (bsz*heads) x tgt x src

        handles.append(
            layer.self_attn.register_forward_pre_hook(want_head_weights, with_kwargs=True)
        )
        handles.append(layer.self_attn.register_forward_hook(keep, with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            src = torch.from_numpy(tokens).to(hub.device)
            features, extra = model(
                src,
                features_only=True,
                return_all_hiddens=True,
                token_type_ids=None if type_tensor is None else type_tensor.to(hub.device),
            )
            logits = encoder.output_layer(features)
            logits = logits[..., torch.from_numpy(to_fairseq).to(logits.device)]
            out = {
                "sequence_output": features,
                "embedding_output": extra["inner_states"][0].transpose(0, 1),
                "all_encoder_layers": torch.stack(
                    [s.transpose(0, 1) for s in extra["inner_states"][1:]]
                ),
                "mlm_logits": logits,
                "mlm_log_probs": F.log_softmax(logits.float(), dim=-1),
            }
            if encoder.pooler is not None:
                out["pooled_output"] = model.pooled_output(features)
            if NEXT_SENTENCE_HEAD in model.classification_heads:
                nsp = model.classification_heads[NEXT_SENTENCE_HEAD](features)
                out["nsp_logits"] = nsp
                out["nsp_log_probs"] = F.log_softmax(nsp.float(), dim=-1)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    bsz, length = ids.shape
    if all(p is not None and p.dim() == 4 for p in captured["probs"]):
        # per head from the residual attention; fairseq's own fused attention (vanilla
        # BERT, --residual-attention none) averages over heads and is left out
        out["attention_probs"] = torch.stack([p.transpose(0, 1) for p in captured["probs"]])
    if all(s is not None for s in captured["stream"]):
        out["attention_stream"] = torch.stack(
            [s.view(bsz, -1, length, length) for s in captured["stream"]]
        )
    return {k: v.detach().float().cpu().numpy() for k, v in out.items()}
