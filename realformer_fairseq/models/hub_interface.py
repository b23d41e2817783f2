"""Hub interface of the encoder-only model (``RealformerRobertaModel.from_pretrained``).

fairseq 0.12.3's ``RobertaHubInterface.fill_mask`` writes the predicted word into the input with
``masked_input.replace(" <mask>", word)``: right for GPT-2 BPE, whose tokens carry their own leading
space, but with subword-nmt or fastBPE codes (space-separated tokens, ``@@`` continuations) it
glues the word to the one before: ``"an orange <mask> ."`` became ``"an orangehat ."``. The
subclass below keeps fairseq's predictions and probabilities and, for those BPEs only, fills the
mask in place, keeping the input's spacing (``"an orange hat ."``).
"""

from fairseq.data.encoders.fastbpe import fastBPE
from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE
from fairseq.models.roberta.hub_interface import RobertaHubInterface

SPACE_SEPARATED_BPES = (SubwordNMTBPE, fastBPE)


class RealformerRobertaHubInterface(RobertaHubInterface):
    """fairseq's :class:`RobertaHubInterface`; ``fill_mask`` keeps the space before ``<mask>``
    with space-separated BPEs (subword-nmt, fastBPE)."""

    def fill_mask(self, masked_input: str, topk: int = 5):
        """fairseq 0.12.3's ``fill_mask`` (same ``(sentence, probability, word)`` triples, same
        order); with a space-separated BPE the sentence is ``masked_input`` with ``<mask>``
        replaced by the word."""
        filled = super().fill_mask(masked_input, topk=topk)
        if not isinstance(self.bpe, SPACE_SEPARATED_BPES):
            return filled
        return [(masked_input.replace("<mask>", word), prob, word) for _, prob, word in filled]
