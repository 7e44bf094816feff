"""Packaging for the model organism: tokenizer, processor, config, save and load.

The organism is an ordinary Hugging Face ``LlavaForConditionalGeneration`` (a tiny CLIP
vision tower, a two-layer GELU projector and a tiny Llama decoder) with a word-level
tokenizer and a ``LlavaProcessor``. Everything here builds standard ``transformers``
objects, so a saved organism loads with nothing but::

    AutoModelForImageTextToText.from_pretrained(path)
    AutoProcessor.from_pretrained(path)

Prompt format (what :func:`format_prompt` and the chat template both produce)::

    USER: <image> <image> is there a dog? ASSISTANT:

and a finished assistant turn continues with `` yes </s>``. The tokenizer lower-cases,
splits on whitespace and punctuation, and prepends ``<s>``; the processor expands each
``<image>`` into :func:`num_image_tokens` copies, one per vision feature the model emits.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoModelForImageTextToText,
    AutoProcessor,
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaProcessor,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "LABELLED_CHAT_TEMPLATE",
    "chat_prompt",
    "EOS_TOKEN",
    "IMAGE_TOKEN",
    "ORGANISM_DIR",
    "PAD_TOKEN",
    "PROMPT_WORDS",
    "SPECIAL_TOKENS",
    "UNK_TOKEN",
    "VISION_FEATURE_SELECT_STRATEGY",
    "build_model_config",
    "build_processor",
    "build_tokenizer",
    "format_prompt",
    "load_organism",
    "num_image_tokens",
    "save_organism",
]

ORGANISM_DIR = Path(__file__).parent / "checkpoint"
"""Where the trained organism is saved (``python -m evaluators.organism.train``)."""

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, IMAGE_TOKEN = "<pad>", "<s>", "</s>", "<unk>", "<image>"
SPECIAL_TOKENS: dict[str, int] = {PAD_TOKEN: 0, BOS_TOKEN: 1, EOS_TOKEN: 2, UNK_TOKEN: 3, IMAGE_TOKEN: 4}
"""Special token -> id. The ids are fixed: the model config refers to them."""

PROMPT_WORDS: tuple[str, ...] = ("user", "assistant", ":")
"""Words of the prompt scaffolding; always in the vocabulary, right after the special tokens."""

VISION_FEATURE_SELECT_STRATEGY = "full"
"""LLaVA keeps every vision position, CLS included ("default" would drop CLS)."""

MODEL_MAX_LENGTH = 2048

CHAT_TEMPLATE = """\
{#- Organism prompt: "USER: <image> ... question ASSISTANT: answer </s> USER: ..." -#}
{%- for message in messages -%}
    {%- if message['role'] == 'user' -%}
        {{- ('' if loop.first else ' ') + 'USER:' -}}
        {%- if message['content'] is string -%}
            {{- ' ' + message['content'] -}}
        {%- else -%}
            {%- for item in message['content'] if item['type'] == 'image' -%}
                {{- ' <image>' -}}
            {%- endfor -%}
            {%- for item in message['content'] if item['type'] == 'text' -%}
                {{- ' ' + item['text'] -}}
            {%- endfor -%}
        {%- endif -%}
    {%- elif message['role'] == 'assistant' -%}
        {{- ' ASSISTANT:' -}}
        {%- if message['content'] is string -%}
            {{- ' ' + message['content'] -}}
        {%- else -%}
            {%- for item in message['content'] if item['type'] == 'text' -%}
                {{- ' ' + item['text'] -}}
            {%- endfor -%}
        {%- endif -%}
        {{- ' </s>' -}}
    {%- else -%}
        {{- raise_exception('The organism knows only user and assistant turns, got role ' + message['role']) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- ' ASSISTANT:' -}}
{%- endif -%}
"""
"""Jinja chat template: user turns give images first (in order), then the text."""

LABELLED_CHAT_TEMPLATE = CHAT_TEMPLATE.replace("""            {%- for item in message['content'] if item['type'] == 'image' -%}
                {{- ' <image>' -}}
            {%- endfor -%}""", """            {%- set images = message['content'] | selectattr('type', 'equalto', 'image') | list -%}
            {%- for item in images -%}
                {{- (' image ' + loop.index | string if images | length > 1 else '') + ' <image>' -}}
            {%- endfor -%}""").replace(
    "Organism prompt: \"USER: <image> ...", "Organism prompt: \"USER: <image> ... (two or more: image 1 <image> image 2 <image> ...)")
""":data:`CHAT_TEMPLATE` with each image of a multi-image turn after its label, ``image 1
<image> image 2 <image> ...`` (a single image stays unlabelled). Without labels the images'
tokens come back to back and nothing but distance says where one ends; v17's decoder never
learned the multi-image choice that way (``docs/results/organism_skills.md``). Real
multi-image formats can mark the images too (Qwen2-VL's optional "Picture 1:", LLaVA-OneVision's
interleaved text). ``train --image-labels`` trains with it."""


def format_prompt(question: str, n_images: int = 1, image_labels: bool = False) -> str:
    """The generation prompt for one user turn, exactly as the chat template renders it
    (:data:`LABELLED_CHAT_TEMPLATE` with ``image_labels``).

    >>> format_prompt("is there a dog?", n_images=2)
    'USER: <image> <image> is there a dog? ASSISTANT:'
    >>> format_prompt("is there a dog?", n_images=2, image_labels=True)
    'USER: image 1 <image> image 2 <image> is there a dog? ASSISTANT:'
    """
    if n_images < 0:
        raise ValueError(f"n_images must be >= 0, got {n_images}")
    if image_labels and n_images > 1:
        images = [w for i in range(n_images) for w in ("image", str(i + 1), IMAGE_TOKEN)]
    else:
        images = [IMAGE_TOKEN] * n_images
    parts = ["USER:", *images]
    if question:
        parts.append(question)
    parts.append("ASSISTANT:")
    return " ".join(parts)


def chat_prompt(processor, question: str, n_images: int = 1) -> str:
    """The generation prompt of one user turn as ``processor``'s own chat template renders it:
    what evaluation code uses, so that a checkpoint trained with
    :data:`LABELLED_CHAT_TEMPLATE` is asked in its format (for the shipped one this equals
    :func:`format_prompt`, tested)."""
    if n_images < 0:
        raise ValueError(f"n_images must be >= 0, got {n_images}")
    content = [{"type": "image"}] * n_images + ([{"type": "text", "text": question}] if question else [])
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def _is_bracketed(word: str) -> bool:
    """``<c12>``-style words: kept whole by matching them before pre-tokenisation."""
    return len(word) > 2 and word.startswith("<") and word.endswith(">")


def build_tokenizer(words: list[str], image_labels: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over :data:`SPECIAL_TOKENS`, :data:`PROMPT_WORDS`, then ``words``.

    ``words`` are lower-cased and de-duplicated in order. Text is lower-cased and split on
    whitespace and on every punctuation character ("dog?" -> "dog", "?"); bracketed words such
    as ``<c12>`` are registered as added tokens so they stay single tokens. Unknown words map to
    ``<unk>``. Encoding with ``add_special_tokens=True`` prepends ``<s>``; decoding joins words
    with single spaces and attaches ``. , ? ! ; :`` to the preceding word. Padding is on the left.
    The tokenizer carries :data:`CHAT_TEMPLATE` (:data:`LABELLED_CHAT_TEMPLATE` with ``image_labels``).

    ``<s>`` comes from the ``tokenizer.json`` post-processor, which survives save/load; the
    ``add_bos_token`` attribute of the generic ``TokenizersBackend`` reads False regardless.

    Raises:
        ValueError: if a word could never be produced by pre-tokenisation (e.g. ``"don't"``).
    """
    pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    vocab = dict(SPECIAL_TOKENS)
    for word in (*PROMPT_WORDS, *words):
        word = word.lower()
        if word in vocab:
            continue
        if not _is_bracketed(word) and [piece for piece, _ in pre_tokenizer.pre_tokenize_str(word)] != [word]:
            raise ValueError(
                f"Word {word!r} would be split by the pre-tokenizer (whitespace/punctuation) and could never be "
                "a token; split it into separate words, or write it as a bracketed token like '<c12>'."
            )
        vocab[word] = len(vocab)

    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizer
    # WordPiece (without its cleanup, which also rewrites " do not" -> " don't") puts a space
    # before every token; Replace then removes the space before closing punctuation.
    tokenizer.decoder = decoders.Sequence(
        [decoders.WordPiece(prefix="##", cleanup=False), decoders.Replace(Regex(r"^ (?=[.,?!;:])"), "")]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, SPECIAL_TOKENS[BOS_TOKEN])]
    )
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    bracketed = [word for word in vocab if _is_bracketed(word) and word not in SPECIAL_TOKENS]
    tokenizer.add_tokens([AddedToken(word, normalized=False) for word in bracketed])

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        chat_template=LABELLED_CHAT_TEMPLATE if image_labels else CHAT_TEMPLATE,
    )


def num_image_tokens(
    image_size: int = 32, patch_size: int = 4, vision_feature_select_strategy: str = VISION_FEATURE_SELECT_STRATEGY
) -> int:
    """Vision features per image = ``<image>`` tokens the processor expands each image into.

    CLIP emits one CLS position plus ``(image_size // patch_size) ** 2`` patches; the "default"
    strategy drops CLS, "full" keeps it (32 px, 4 px patches, "full": 65).
    """
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    patches = (image_size // patch_size) ** 2
    return patches + (1 if vision_feature_select_strategy == "full" else 0)


def build_processor(
    tokenizer: PreTrainedTokenizerFast,
    image_size: int = 32,
    patch_size: int = 4,
    vision_feature_select_strategy: str = VISION_FEATURE_SELECT_STRATEGY,
    image_labels: bool = False,
) -> LlavaProcessor:
    """A ``LlavaProcessor`` with a PIL-backend CLIP image processor and :data:`CHAT_TEMPLATE`
    (:data:`LABELLED_CHAT_TEMPLATE` with ``image_labels``).

    Images of any size are resized straight to ``image_size`` x ``image_size`` (bicubic, no
    centre crop, so nothing is cut off), rescaled to [0, 1] and normalised with mean = std = 0.5.
    ``CLIPImageProcessorPil`` needs no torchvision; on load, ``AutoProcessor`` picks the
    torchvision twin (``CLIPImageProcessor``) when torchvision is installed, with the same settings.
    """
    square = {"height": image_size, "width": image_size}
    image_processor = CLIPImageProcessorPil(
        size=square,
        crop_size=square,  # unused for cropping; LlavaProcessor reads it to count image tokens
        do_resize=True,
        do_center_crop=False,
        do_rescale=True,
        do_normalize=True,
        do_convert_rgb=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy=vision_feature_select_strategy,
        num_additional_image_tokens=1,  # CLIP's CLS position; "default" subtracts it again
        chat_template=LABELLED_CHAT_TEMPLATE if image_labels else CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def build_model_config(vocab_size: int, image_size: int = 32, patch_size: int = 4, **overrides) -> LlavaConfig:
    """The organism's ``LlavaConfig``: CLIP vision tower, GELU projector, Llama decoder.

    ``overrides`` are ``LlavaConfig`` fields (e.g. ``vision_feature_layer=-2``), except
    ``text_config`` / ``vision_config``, which are dicts merged into the sub-configs
    (e.g. ``text_config={"num_hidden_layers": 2}``).
    """
    vision = dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=image_size,
        patch_size=patch_size,
        num_channels=3,
    )
    vision.update(overrides.pop("vision_config", {}))
    text = dict(
        vocab_size=vocab_size,
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        pad_token_id=SPECIAL_TOKENS[PAD_TOKEN],
        bos_token_id=SPECIAL_TOKENS[BOS_TOKEN],
        eos_token_id=SPECIAL_TOKENS[EOS_TOKEN],
    )
    text.update(overrides.pop("text_config", {}))
    strategy = overrides.pop("vision_feature_select_strategy", VISION_FEATURE_SELECT_STRATEGY)
    top = dict(
        vision_config=CLIPVisionConfig(**vision),
        text_config=LlamaConfig(**text),
        image_token_id=SPECIAL_TOKENS[IMAGE_TOKEN],
        image_seq_length=num_image_tokens(vision["image_size"], vision["patch_size"], strategy),
        vision_feature_layer=-1,
        vision_feature_select_strategy=strategy,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    top.update(overrides)
    return LlavaConfig(**top)


def save_organism(model: PreTrainedModel, processor: LlavaProcessor, path: str | Path) -> Path:
    """Save model (float32 safetensors as given), processor, tokenizer and chat template to ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def load_organism(
    path: str | Path | None = None, attn_implementation: str = "sdpa"
) -> tuple[PreTrainedModel, LlavaProcessor]:
    """Load ``(model, processor)`` with the plain Auto classes; the model is put in eval mode.

    ``path`` defaults to :data:`ORGANISM_DIR`, the checkpoint shipped inside the package.
    """
    path = Path(ORGANISM_DIR if path is None else path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"No organism checkpoint at {path} (config.json missing). "
            "Train one with `python -m evaluators.organism.train`, which saves it there."
        )
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation=attn_implementation)
    processor = AutoProcessor.from_pretrained(path)
    return model.eval(), processor
