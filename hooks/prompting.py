"""One user turn as a checkpoint's processor expects it, with or without a chat template.

Most VLM checkpoints ship a chat template, and ``processor.apply_chat_template`` writes the
turn. PaliGemma's do not (its mix checkpoints are prompted with a bare task prefix,
"detect dog" / "answer en is there a dog?"), and ``apply_chat_template`` then raises, so any
tool that asked through it could not evaluate or verify a PaliGemma model at all. Without a
template the turn is the processor's image placeholder once per image, then the text: the
layout PaliGemma's processor documents (it then inserts BOS after the placeholders and the
closing newline itself), and the only one a template-less processor can be given without
knowing its family.
"""

from __future__ import annotations


#: processors whose checkpoints ship no chat template by design; any other one without a
#: template is warned about, once per class (a LLaVA folder missing its chat_template.json
#: would otherwise be asked without its roles, and answer worse without a word)
NO_TEMPLATE_BY_DESIGN = frozenset({"PaliGemmaProcessor"})
_warned: set[str] = set()


def has_chat_template(processor) -> bool:
    """Whether ``processor`` has a chat template to write a turn with (``apply_chat_template``
    reads the processor's own)."""
    return bool(getattr(processor, "chat_template", None))


def user_prompt(processor, text: str, n_images: int = 1) -> str:
    """The prompt for one user turn with ``n_images`` images, then ``text``, ending where the
    model's answer starts: the processor's chat template with a generation prompt where it
    has one, else ``n_images`` image placeholders followed by ``text``. A ``ValueError`` for a
    processor with neither a template nor an image placeholder (``image_token``), and for a
    ``text`` that already holds the image placeholder: a prompt templated by the caller
    would carry its images twice, which the processor refuses with a count of image tokens
    that does not say why."""
    if n_images < 0:
        raise ValueError(f"n_images must be >= 0, got {n_images}")
    placeholder = getattr(processor, "image_token", None)
    # Gemma 3's template writes the image's opening token (boi_token), not its image_token
    for marker in (placeholder, getattr(processor, "boi_token", None)):
        if isinstance(marker, str) and marker and marker in text:
            raise ValueError(f"the prompt already holds the image placeholder {marker!r} (a chat-templated "
                             f"prompt?): pass the question alone, e.g. 'Is there a dog in the image?'; the chat "
                             f"template and the image placeholders are added here. Got {text[:80]!r}")
    if has_chat_template(processor):
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
        return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    name = type(processor).__name__
    if name not in NO_TEMPLATE_BY_DESIGN and name not in _warned:
        import warnings

        _warned.add(name)
        warnings.warn(f"{name} has no chat template: prompts are its image placeholder(s) then the text, without "
                      "the roles its checkpoint may have been trained with (set processor.chat_template)",
                      stacklevel=2)
    if n_images and not placeholder:
        raise ValueError(f"{type(processor).__name__} has no chat template and no image_token: give the processor a "
                         "chat_template (processor.chat_template = ...) so the images can be placed in the prompt")
    return (placeholder or "") * n_images + text


__all__ = ["NO_TEMPLATE_BY_DESIGN", "has_chat_template", "user_prompt"]
