"""Tiny processors for tiny random models: the family's own processor class, its image
processor (:func:`tiny_image_processor`), a word-level tokenizer whose special tokens sit at
the tiny config's ids, and a chat template in the family's format -- so that
``AutoProcessor.from_pretrained`` / ``AutoModelForImageTextToText.from_pretrained`` on a
saved folder behave as a real checkpoint does, and tools that take ``--model <path>``
(``vlm-eval``, ``vlm-report``) can be run end to end on a non-LLaVA family without weights.

Families are data (:data:`PROCESSOR_SPECS`): the processor class, the special tokens and
the config attributes holding their ids, and the chat template. Pass the words your
prompts use (the evaluators' tests pass the organism's vocabulary, so the built-in probe
suites tokenize without unknown words).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .tiny import build_tiny_model, tiny_image_processor

_GEMMA_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{%+ if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}<start_of_image>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<end_of_turn>\n"
    "{%+ endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model\n{%+ endif -%}"
)
# LLaVA-NeXT's (Vicuna) format: "USER: <image>\n... ASSISTANT:"
_VICUNA_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}"
    "{{- message['role'].upper() + ': ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<image>\\n' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- ' ' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)
#: per family: the processor class; special tokens -> the config attribute holding the id
#: (or an id counted back from the end of the vocabulary); the names the processor reads
#: from its tokenizer; constructor arguments (a string is a config attribute path, anything
#: else the value itself); attributes set on the image processor (config attribute paths);
#: and the chat template (None where the family's checkpoints ship none). Families whose processor needs
#: torchvision in transformers 5 (those with a video processor -- Qwen2/2.5/3-VL,
#: LLaVA-OneVision, InternVL, SmolVLM -- and Pixtral's, for Mistral3) cannot be built
#: without it, so they are not listed; their models are covered through ``tiny_inputs``.
PROCESSOR_SPECS: dict[str, dict] = {
    "gemma3": {
        "class": "Gemma3Processor",
        "specials": {"<start_of_image>": "boi_token_id", "<end_of_image>": "eoi_token_id",
                     "<image_soft_token>": "image_token_id", "<start_of_turn>": -2, "<end_of_turn>": -1},
        # the names Gemma3Processor reads from its tokenizer
        "named": {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        "kwargs": {"image_seq_length": "mm_tokens_per_image"},
        "chat_template": _GEMMA_TEMPLATE,
    },
    "llava_next": {
        "class": "LlavaNextProcessor",
        "specials": {"<image>": "image_token_index"},
        # the CLIP tower's class token is one more position than the patches
        "kwargs": {"patch_size": "vision_config.patch_size",
                   "vision_feature_select_strategy": "vision_feature_select_strategy", "num_additional_image_tokens": 1},
        "chat_template": _VICUNA_TEMPLATE,
    },
    # PaliGemma's checkpoints ship no chat template: prompts are the image placeholders, then
    # the text (the processor adds BOS and the newline); the image processor carries the
    # number of image tokens, as their preprocessor_config.json does
    "paligemma": {
        "class": "PaliGemmaProcessor",
        "specials": {"<image>": "image_token_index"},
        "named": {"image_token": "<image>"},
        "image_attributes": {"image_seq_length": "text_config.num_image_tokens"},
        "chat_template": None,
    },
}

TINY_PROCESSOR_TYPES = tuple(PROCESSOR_SPECS)


#: a generic VQA vocabulary for the tokenizer when the caller gives none
DEFAULT_WORDS = tuple(
    "is there a an the in image images picture of and or no yes not what which where how many colour color "
    "left right above below none answer describe first second third i am certain think suspect believe see "
    ". , ? : ! ( ) 1 2 3 4 5 6 7 8 9 0".split()
)


def tiny_tokenizer(model_type: str, config, words: Sequence[str] | None = None):
    """A word-level fast tokenizer for the tiny ``config``: pad / bos / eos at the text
    config's ids, the family's specials at the ids the config names, ``words`` (default
    :data:`DEFAULT_WORDS`; lowercase, as many as fit) in between."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    spec = PROCESSOR_SPECS[model_type]
    text_config = config.get_text_config()
    size = text_config.vocab_size
    fixed = {"<pad>": text_config.pad_token_id, "<s>": text_config.bos_token_id, "</s>": text_config.eos_token_id}
    for token, where in spec["specials"].items():
        fixed[token] = size + where if isinstance(where, int) else _attribute(config, where)
    if len(set(fixed.values())) != len(fixed) or any(i is None or not 0 <= i < size for i in fixed.values()):
        raise ValueError(f"{model_type}: special token ids {fixed} must be distinct and inside vocab_size {size}")
    free = [i for i in range(size) if i not in set(fixed.values())]
    taken = set(fixed) | {"<unk>"}  # a word never takes a special token's place
    words = [w for w in dict.fromkeys(w.lower() for w in (DEFAULT_WORDS if words is None else words)) if w not in taken]
    words = words[: len(free) - 1]
    vocab = {**fixed, "<unk>": free[0], **{w: i for w, i in zip(words, free[1:])}}
    # every id below vocab_size holds a token, so tokens a processor adds (PaliGemma's 1152
    # <locNNNN> / <segNNN>) get ids past it: added into a vocabulary with holes, they were
    # given ids it already used, and the reloaded tokenizer no longer matched its specials
    vocab.update({f"<unused{i}>": i for i in free[1 + len(words):]})
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Punctuation(behavior="isolated")])
    # every special is matched whole before pre-tokenization splits "<start_of_turn>" at
    # its punctuation
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fixed])
    named = spec.get("named", {})
    specials = [t for t in fixed if t not in ("<pad>", "<s>", "</s>") and t not in named.values()]
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", additional_special_tokens=specials, padding_side="left",
                                   extra_special_tokens=named)


def _attribute(config, path: str):
    """``config.a.b`` for the path ``"a.b"``."""
    for name in path.split("."):
        config = getattr(config, name)
    return config


def tiny_processor(model_type: str, config, words: Sequence[str] | None = None):
    """The family's processor for a tiny model built from ``config`` (``words``: see
    :func:`tiny_tokenizer`)."""
    import transformers

    if model_type not in PROCESSOR_SPECS:
        raise ValueError(f"no tiny processor for {model_type!r}; known: {', '.join(TINY_PROCESSOR_TYPES)}")
    spec = PROCESSOR_SPECS[model_type]
    cls = getattr(transformers, spec["class"])
    kwargs = {name: _attribute(config, value) if isinstance(value, str) else value
              for name, value in spec.get("kwargs", {}).items()}
    image_processor = tiny_image_processor(model_type)
    for name, path in spec.get("image_attributes", {}).items():
        setattr(image_processor, name, _attribute(config, path))
    return cls(image_processor=image_processor, tokenizer=tiny_tokenizer(model_type, config, words),
               chat_template=spec["chat_template"], **kwargs)


def save_tiny_checkpoint(model_type: str, folder: str | Path, seed: int = 0,
                         words: Sequence[str] | None = None) -> Path:
    """Save a tiny random ``model_type`` model and its processor to ``folder``, loadable
    with ``AutoModelForImageTextToText`` / ``AutoProcessor.from_pretrained(folder)``."""
    folder = Path(folder)
    model = build_tiny_model(model_type, seed=seed)
    model.generation_config.pad_token_id = model.config.get_text_config().pad_token_id
    model.save_pretrained(folder)
    tiny_processor(model_type, model.config, words).save_pretrained(folder)
    return folder
