"""Which of the installed transformers' VLM families the hooks resolve, and how.

    vlm-hooks support                          # every image-text-to-text model type
    vlm-hooks support llava vipllava blip-2    # some of them

For each model type transformers registers for ``AutoModelForImageTextToText``, the model is
built from the type's *default* config on the ``meta`` device (no memory, no weights; 37 s for
all 100 of transformers 5.24 on 2 CPU cores) and given to :func:`hooks.resolve`. The answer is one of:

* ``table`` -- a JSON file in ``hooks/adapters/`` states its facts (module paths, pixel
  inputs, where its image tokens lie): every mitigation and localisation applies, and the
  tests run it on a tiny model;
* ``registered`` -- an adapter given at run time (:func:`hooks.register_adapter`);
* ``class`` -- no file of its own, but its class is (or subclasses) one a table type maps
  to (``shieldgemma2`` is Gemma 3's class): that file's facts;
* ``introspected`` -- no file: introspection found every module, and the facts are guesses
  (:func:`hooks.points.resolve` warns which); localisation refuses, since where its image
  tokens lie is not known. The hooks attach; whether a family's forward keeps the
  semantics the mitigations rely on is not tested for these (session 37 ran seven of them
  on tiny models: VCD at alpha = 0 gave the plain tokens, and detach restored them);
* ``refused`` -- :func:`hooks.resolve` raises :class:`hooks.HookPointError`, which
  names what is missing (no projector between a vision encoder and the decoder, an
  encoder-decoder language model, ...);
* ``not built`` -- the default config does not build here (a missing optional package such
  as ``timm``, or a default config transformers itself cannot instantiate).

A default config stands in for the type's checkpoints, and a checkpoint's config may differ:
Gemma 4's default has no vision tower (so it reads ``refused`` here, while its checkpoints
resolve through ``gemma4.json``), and LFM2-VL's makes every decoder layer an attention layer
(so it reads ``introspected``, while its checkpoints, which mix convolution layers in, are
refused). ``vlm-hooks inspect MODEL`` resolves a given checkpoint.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

from .adapters.introspect import HookPointError

STATUSES = ("table", "registered", "class", "introspected", "refused", "not built")


class UnknownModelType(ValueError):
    """A model type the installed transformers does not map for ``AutoModelForImageTextToText``."""


@dataclass(frozen=True)
class Support:
    """How one model type resolves: ``status`` (one of :data:`STATUSES`), the model class
    (empty when it was not built) and a one-line ``detail`` (the token layout, the guessed
    facts or the reason)."""

    model_type: str
    status: str
    model_class: str
    detail: str


def image_text_to_text_types() -> list[str]:
    """The model types the installed transformers maps for ``AutoModelForImageTextToText``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def _first_line(error: BaseException, limit: int = 240) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def support(model_type: str) -> Support:
    """How :func:`hooks.resolve` treats ``model_type``'s default model (module docstring)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from .points import resolve

    _check([model_type])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.for_model(model_type)
            with torch.device("meta"):
                model = AutoModelForImageTextToText.from_config(config)
    except Exception as error:  # noqa: BLE001 -- a family that does not build is reported, not raised
        return Support(model_type, "not built", "", _first_line(error))
    name = type(model).__name__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guess warning is what "introspected" reports
        try:
            points = resolve(model)
        except HookPointError as error:
            return Support(model_type, "refused", name, _first_line(error))
    adapter = points.adapter
    source = adapter.source or ""
    if source.startswith("introspection"):
        detail = (f"pixel inputs {', '.join(adapter.pixel_inputs) or 'none'} (guessed); "
                  "token layout unknown: localisation refuses")
        return Support(model_type, "introspected", name, detail)
    status = "class" if "(its class" in source else "table" if source.startswith("table") else "registered"
    return Support(model_type, status, name, f"token layout {adapter.token_layout!r}; {source}")


def _check(model_types: Iterable[str]) -> None:
    """An :class:`UnknownModelType` for the first of ``model_types`` transformers does not map."""
    known = image_text_to_text_types()
    for model_type in model_types:
        if model_type not in known:
            from .errors import unknown

            raise UnknownModelType(unknown("model_type (image-text-to-text, installed transformers)", model_type, known))


def support_matrix(model_types: Iterable[str] | None = None) -> list[Support]:
    """:func:`support` for each of ``model_types`` (default: every image-text-to-text type);
    every name is checked before any model is built."""
    model_types = image_text_to_text_types() if model_types is None else list(model_types)
    _check(model_types)
    return [support(t) for t in model_types]


def markdown(rows: Sequence[Support]) -> str:
    """The rows as a Markdown table, then the count per status."""
    lines = ["| model_type | status | class | detail |", "|---|---|---|---|"]
    lines += [f"| `{r.model_type}` | {r.status} | {r.model_class} | {r.detail.replace('|', '/')} |" for r in rows]
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    lines += ["", ", ".join(f"{s}: {n}" for s, n in counts.items() if n) + f" (of {len(rows)})"]
    return "\n".join(lines)
