"""Tokenizers in the styles of real checkpoints, trained in milliseconds (no downloads).

The tiny processors' tokenizers are word-level (:mod:`hooks.testing.processors`); code that
reads text back from token ids (``mitigate.spans``) also has to hold for subword tokenizers,
whose pieces carry the spacing and may split a character across tokens.
"""

from __future__ import annotations

#: what the tokenizers are trained on: accents, CJK and an emoji among plain English
CORPUS = ("I am certain there is no dog in the image. Is there a dog? Le café est très bon.",
          "The red cup is left of the plate; 日本の猫 sits there ☕ and naïve people agree.")


class WordIds:
    """A real (if plain) tokenizer for the id-only tiny models: token i decodes to 'w<i>',
    ids 0-2 are special. Enough for code that reads prompts back as text
    (``mitigate.spans``) to run on every family's random ids."""

    all_special_ids = [0, 1, 2]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return " ".join(f"w{i}" for i in ids)

    @classmethod
    def middle_pair(cls, model, inputs) -> list[list[str]]:
        """Per row of ``inputs``, two adjacent words of its prompt, as decoded here (not image,
        special or the last tokens): a span for prior suppression to damp on any family."""
        from hooks import resolve

        image = resolve(model).image_token_mask(inputs["input_ids"])
        rows = []
        for row, ids in enumerate(inputs["input_ids"].tolist()):
            real = inputs["attention_mask"][row].nonzero().flatten().tolist()
            ok = [p for p in real[1:-2] if not image[row, p] and not image[row, p + 1]
                  and ids[p] not in cls.all_special_ids and ids[p + 1] not in cls.all_special_ids]
            p = ok[len(ok) // 2]
            rows.append([f"w{ids[p]} w{ids[p + 1]}"])
        return rows


def trained_tokenizers() -> dict:
    """Byte-level BPE (GPT-2 / Llama 3 / Qwen style: characters split across tokens),
    SentencePiece-style BPE (Llama 2 / Mistral / Gemma style: "\u2581" for spaces) and
    WordPiece (BERT style: "##" continuations), trained here on a few sentences with
    accents, CJK and an emoji."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = list(CORPUS) * 3
    byte = Tokenizer(models.BPE())
    byte.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte.decoder = decoders.ByteLevel()
    byte.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    piece = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    piece.normalizer = normalizers.Replace(" ", "\u2581")
    piece.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    piece.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
    piece.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=150, special_tokens=["<pad>", "<unk>"]))
    word = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    word.decoder = decoders.WordPiece()
    word.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]"]))
    return {name: PreTrainedTokenizerFast(tokenizer_object=t, pad_token=pad)
            for name, t, pad in (("byte-level BPE", byte, "<pad>"), ("sentencepiece BPE", piece, "<pad>"),
                                 ("wordpiece", word, "[PAD]"))}
