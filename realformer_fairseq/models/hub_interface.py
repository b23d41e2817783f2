"""Hub interfaces (``from_pretrained``) of the plugin's models.

Every family: a checkpoint that holds another model class than the plugin's (e.g. fairseq's own
``transformer``, loaded through ``RealformerTransformerModel.from_pretrained``) is loaded as that
class, as fairseq does, with one warning naming the class and the architecture
(:func:`warn_if_not_plugin_model`).

Translation (``RealformerTransformerModel.from_pretrained``): fairseq 0.12.3 builds the Moses
tokenizer that ``tokenizer="moses"`` asks for from ``MosesTokenizerConfig``'s defaults,
``source_lang="en", target_lang="en"``, unless the call passes both languages: a French model's
output was detokenized with English rules (``l' eau`` for ``l'eau``). ``fairseq-interactive -s en
-t fr`` gives the tokenizer the task's languages; :func:`use_task_languages` does the same for
the hub, from the task (the data-bin's ``dict.SRC.txt`` / ``dict.TGT.txt`` or the checkpoint's
``--source-lang`` / ``--target-lang``). Languages given to ``from_pretrained`` are kept.

Encoder-only (``RealformerRobertaModel.from_pretrained``):
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

import logging

import torch
from fairseq import utils
from fairseq.data import encoders
from fairseq.data.encoders.fastbpe import fastBPE
from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE
from fairseq.models.roberta.hub_interface import RobertaHubInterface
from omegaconf import open_dict

logger = logging.getLogger(__name__)

from ..tf_import.wordpiece import CONTINUATION_PREFIX, WordPieceBPE

SPACE_SEPARATED_BPES = (SubwordNMTBPE, fastBPE)
TOKENIZER_LANGUAGES = ("source_lang", "target_lang")


def warn_if_not_plugin_model(models, plugin_class, checkpoint: str):
    """One warning for each model of ``models`` (a hub's ensemble) that is not a
    ``plugin_class``: the class fairseq loaded from ``checkpoint`` and its ``--arch``."""
    for model in models:
        if not isinstance(model, plugin_class):
            arch = getattr(getattr(model, "cfg", None), "arch", None) or getattr(
                getattr(model, "args", None), "arch", "?"
            )
            logger.warning(
                "%s holds %s.%s (--arch %s), not a %s: loaded as %s, without this plugin's "
                "residual attention or ADMIN",
                checkpoint,
                type(model).__module__,
                type(model).__name__,
                arch,
                plugin_class.__name__,
                type(model).__name__,
            )


def use_task_languages(hub, overrides: dict):
    """Give the hub's Moses tokenizer the task's source and target languages, except those
    passed to ``from_pretrained`` (``overrides``); rebuilds ``hub.tokenizer`` if one changed."""
    tokenizer_cfg = hub.cfg.get("tokenizer", None)
    if tokenizer_cfg is None or tokenizer_cfg.get("_name", None) != "moses":
        return hub
    changed = []
    with open_dict(tokenizer_cfg):
        for key in TOKENIZER_LANGUAGES:
            lang = getattr(hub.task.cfg, key, None)
            if key not in overrides and lang and tokenizer_cfg.get(key, None) != lang:
                tokenizer_cfg[key] = lang
                changed.append(key)
    if changed:
        hub.tokenizer = encoders.build_tokenizer(tokenizer_cfg)
        logger.info(
            "Moses tokenizer: source %s, target %s (the task's languages)",
            tokenizer_cfg.source_lang,
            tokenizer_cfg.target_lang,
        )
    return hub


def translation_hub(hub, plugin_class, overrides: dict, checkpoint: str):
    """Finish fairseq's ``GeneratorHubInterface`` of ``RealformerTransformerModel
    .from_pretrained``: the warning of :func:`warn_if_not_plugin_model` and the task's
    languages for the Moses tokenizer (:func:`use_task_languages`)."""
    warn_if_not_plugin_model(hub.models, plugin_class, checkpoint)
    return use_task_languages(hub, overrides)


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

    def answer(self, question: str, context: str, **decoding) -> dict:
        """A model fine-tuned with ``--task squad`` answers ``question`` about ``context`` (raw
        text), as run_squad.py does: ``{"text", "start", "end", "null_odds", "nbest"}``
        (``realformer_fairseq.squad.predict.answer``; ``decoding``: ``n_best_size``,
        ``max_answer_length``, ``null_score_diff_threshold``)."""
        from ..squad.predict import answer

        return answer(self, question, context, **decoding)

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
