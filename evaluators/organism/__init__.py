"""The model organism: a tiny trained LLaVA shipped inside the package.

:mod:`evaluators.organism.package` builds its tokenizer, processor and config and saves
and loads it with the standard Hugging Face Auto classes.
"""

from evaluators.organism.package import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    LABELLED_CHAT_TEMPLATE,
    EOS_TOKEN,
    IMAGE_TOKEN,
    ORGANISM_DIR,
    PAD_TOKEN,
    PROMPT_WORDS,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    VISION_FEATURE_SELECT_STRATEGY,
    build_model_config,
    build_processor,
    build_tokenizer,
    chat_prompt,
    format_prompt,
    load_organism,
    num_image_tokens,
    save_organism,
)

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "LABELLED_CHAT_TEMPLATE",
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
    "chat_prompt",
    "format_prompt",
    "load_organism",
    "num_image_tokens",
    "save_organism",
]
