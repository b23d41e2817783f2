"""``studies.saved_tensors``: what autograd keeps per layer for RealFormer's residual attention
(He et al. 2020, arXiv 2012.11747) in the decoder-only LM, against fairseq's ``transformer_lm``
(toy size). RealFormer keeps what fairseq's eager path keeps (one float32 ``(bsz*heads, L, L)``
probability tensor more than the fused path) plus ADMIN's two ω vectors; the running-sum score
stream passed to the next layer is not kept."""

from studies import saved_tensors
from studies.bench_models import dummy_dictionary

TOY = saved_tensors.SIZES["toy"]


def test_residual_attention_keeps_what_fairseqs_eager_path_keeps():
    dictionary = dummy_dictionary(100)
    length = TOY["lengths"][0]
    result = {v: saved_tensors.measure(v, TOY, length, dictionary) for v in saved_tensors.VARIANTS}
    bsz = result["vanilla"]["batch_size"]
    assert bsz == TOY["batch_tokens"] // length
    probabilities = f"{bsz * TOY['heads']}x{length}x{length} float32"
    omega = 2 * TOY["width"] * 4  # ADMIN: omega_delta of the two sublayers (float32)
    for layer in map(str, range(1, TOY["layers"])):
        kept = {v: r["per_layer"][layer] for v, r in result.items()}
        assert kept["vanilla"]["score_sized"] == kept["admin"]["score_sized"] == []
        assert kept["vanilla_eager"]["score_sized"] == [probabilities]
        assert kept["realformer"]["score_sized"] == [probabilities]
        assert kept["realformer"]["bytes"] == kept["vanilla_eager"]["bytes"] + omega
        assert kept["admin"]["bytes"] == kept["vanilla"]["bytes"] + omega
