"""Hub interface of the encoder-only model (``RealformerRobertaModel.from_pretrained``).

fairseq 0.12.3's ``RobertaHubInterface.fill_mask`` writes the predicted word into the input with
``masked_input.replace(" <mask>", word)``: right for GPT-2 BPE, whose tokens carry their own leading
space, but with subword-nmt or fastBPE codes (space-separated tokens, ``@@`` continuations) it
glues the word to the one before: ``"an orange <mask> ."`` became ``"an orangehat ."``. The
subclass below keeps fairseq's predictions and probabilities and, for those BPEs only, fills the
mask in place, keeping the input's spacing (``"an orange hat ."``).

With BERT's WordPiece (``--bpe wordpiece``, models imported by ``realformer-import-tf``),
``encode(a, b)`` gives BERT's pair layout ``<s> a </s> b </s>`` (``[CLS] a [SEP] b [SEP]``), not
RoBERTa's ``<s> a </s> </s> b </s>``, and ``fill_mask`` joins a predicted ``##`` continuation to
the word before and puts any other piece where ``<mask>`` stood.
"""

import torch
from fairseq import utils
from fairseq.data.encoders.fastbpe import fastBPE
from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE
from fairseq.models.roberta.hub_interface import RobertaHubInterface

from ..tf_import.wordpiece import CONTINUATION_PREFIX, WordPieceBPE

SPACE_SEPARATED_BPES = (SubwordNMTBPE, fastBPE)


class RealformerRobertaHubInterface(RobertaHubInterface):
    """fairseq's :class:`RobertaHubInterface`; ``fill_mask`` keeps the space before ``<mask>``
    with space-separated BPEs (subword-nmt, fastBPE); BERT's layouts with WordPiece."""

    def encode(self, sentence: str, *addl_sentences, no_separator=None) -> torch.LongTensor:
        """fairseq's ``encode``; ``no_separator`` defaults to True with WordPiece (BERT's
        ``[CLS] A [SEP] B [SEP]``), to fairseq's False otherwise."""
        if no_separator is None:
            no_separator = isinstance(self.bpe, WordPieceBPE)
        return super().encode(sentence, *addl_sentences, no_separator=no_separator)

    def wordpiece_fill_mask(self, masked_input: str, topk: int = 5):
        """fairseq 0.12.3's ``fill_mask`` for WordPiece: the same model call and top-k
        (probabilities over the fairseq dictionary at the one ``<mask>``), the sentence built
        with BERT's spacing."""
        masked_token = "<mask>"
        if masked_input.count(masked_token) != 1:
            raise ValueError(f"put exactly one {masked_token} in the input: {masked_input!r}")
        before, after = masked_input.split(masked_token)
        pieces = " ".join(
            p for p in (self.bpe.encode(before.rstrip()), masked_token, self.bpe.encode(after)) if p
        )
        tokens = self.task.source_dictionary.encode_line(
            "<s> " + pieces + " </s>", append_eos=False, add_if_not_exist=False
        ).long()
        masked_index = (tokens == self.task.mask_idx).nonzero(as_tuple=False)
        with utils.model_eval(self.model):
            logits, _ = self.model(tokens.unsqueeze(0).to(self.device), features_only=False)
        prob = logits[0, masked_index, :].squeeze().softmax(dim=0)
        values, index = prob.topk(k=topk, dim=0)
        filled = []
        dictionary = self.task.source_dictionary
        for value, piece in zip(values.tolist(), [dictionary[i] for i in index.tolist()]):
            word = self.bpe.decode(piece)
            if piece.startswith(CONTINUATION_PREFIX):
                sentence = before.rstrip() + word + after
            else:
                sentence = before + word + after
            filled.append((sentence, value, word))
        return filled

    def fill_mask(self, masked_input: str, topk: int = 5):
        """fairseq 0.12.3's ``fill_mask`` (same ``(sentence, probability, word)`` triples, same
        order); with a space-separated BPE the sentence is ``masked_input`` with ``<mask>``
        replaced by the word; with WordPiece, :meth:`wordpiece_fill_mask`."""
        if isinstance(self.bpe, WordPieceBPE):
            return self.wordpiece_fill_mask(masked_input, topk=topk)

        filled = super().fill_mask(masked_input, topk=topk)
        if not isinstance(self.bpe, SPACE_SEPARATED_BPES):
            return filled
        return [(masked_input.replace("<mask>", word), prob, word) for _, prob, word in filled]
