"""Crop-and-verify with DO-Bench's PerceptionAbility views.

DO-Bench (Sec. 3.2, Fig. 4c) shows many false denials of present objects are recovered
when the evidence is concentrated: the same question asked on the Cluster view (object and
neighbours) or the Crop view (object with a margin) is answered right. ViCrop (ICLR 2025)
finds the region without ground truth from the model's own attention. This mitigation
combines them at inference time:

1. **answer** the question on the original image (plain ``generate()``), keeping the first
   token's probabilities;
2. **gate**: verify only when the first answer is not confident (top first-token
   probability below ``gate``), is not "yes" (the policy never overturns a "yes") and is
   not a box or free text (never replaced, see the policy below) -- so the extra passes
   run only when they can change the answer (:meth:`CropVerify.gate_rows`);
   all gated queries of a call are localised together and re-asked in one ``generate()``;
3. **localise** the queried object: a box from the caller's ``localizer`` (any detector
   callable), from attention (``locate="attention"``, the default; :mod:`mitigate.localize`:
   ViCrop's last-token map; ``queries="object"`` reads the tokens naming the object,
   ``heads="peak"`` the most concentrated head, ``generic_prompt=None`` drops ViCrop's
   normalising row) or from the embeddings (:mod:`mitigate.localize_embedding`:
   ``locate="embedding"``, the image tokens nearest the object's name in the decoder's
   input space; ``locate="zoom"``, the same read on tiles of the image, for objects smaller
   than a patch). Attention and embeddings are captured at step 1's own prefill (attention:
   :mod:`hooks.capture`, scores recomputed from the chosen layers' queries and keys; the
   answer untouched), so the only localisation pass is ViCrop's one forward of the generic
   prompt over the gated images, and ``locate="embedding"`` needs none; ``locate="zoom"``
   runs the vision tower and projector on the gated images' tiles (the decoder does not run);
4. **views**: Cluster / Crop cut from the *original* image (not the resized model input)
   with DO-Bench's margin rule, the same geometry the evaluators use
   (:mod:`evaluators.world.views`);
5. **re-ask** on each view -- by default the question alone: belief and assertion sentences
   the prompt carries ("I am certain there is no dog in the image.", found by
   :func:`mitigate.spans.find_prior_spans`) are left out of the views' prompts
   (``strip_priors``), so a view answers what it shows rather than whether the user is
   right; the views of a yes/no question answer with one token (``yes_no_view_tokens``),
   all the policy reads of them -- and **combine** (policy, configurable), by the kind of the first answer
   (:func:`mitigate.answer_kinds.answer_kind`, which reads the answer and, for "how many"
   questions, the question). A view is a part of the image, so it is evidence of what is
   there, never of what is not:

   * ``yes_no``: a "no" is overturned to "yes" only when a view answers "yes" with
     probability above ``tau`` (strict; the view's own answer must be "yes" too, which
     matters for ``tau`` < 0.5); a "yes" is never re-asked;
   * ``count``: a view's count replaces the first one only when it is *higher* and its
     confidence is above both ``tau`` and the first answer's (a crop holds at most the
     instances the image holds, so a lower count in a view says nothing); "no" / "none"
     to a "how many" question is the count 0, never overturned to "yes";
   * ``short`` (an attribute such as a colour, a word or a few): the most confident view's
     short answer replaces the first when its confidence is above both ``tau`` and the
     first answer's;
   * ``box`` (coordinates, or "none" for an absent object) and ``free_form`` (captions,
     sentences -- any answer longer than ``SHORT_ANSWER_WORDS`` = 3 words that is not a
     yes/no): never replaced -- a view's box is in the view's coordinates and a view's
     caption describes the view -- so these are not re-asked at all;
     ``stats["not_verifiable"]`` counts them. Captions are checked object by object with
     :meth:`CropVerify.verify_caption`.

Two options, off by default: ``views`` may include ``"pair"`` -- the original and its crop
as two images of one prompt, for models that take several -- and ``control=True`` also
asks the question on a window of the crop's size placed as far from the object as the
image allows (:func:`control_box`); a "no" is then overturned only when a view's p(yes)
exceeds both ``tau`` and the control's. A model that says "yes" to any zoomed-in cut says
it to the control too, so the control separates "the object is here" from "crops look
full" (it does not apply to counts and colours).

Multi-image "in which image is there an X?" questions (MIOH's selective existence task)
go through :meth:`CropVerify.answer_which_image`: an unconfident "none of the above" is
checked by asking the question of each image alone (:mod:`mitigate.which_image`), with
that image's views, and becomes the image with the strongest "yes" above ``tau``. With
``which_image="decompose"`` every unconfident answer is re-derived that way, image answers
included, and "none of the above" when no image passes ``tau`` (MIOH Sec. 5.5: the same
question asked image by image is answered better than over all the images at once).

For free-form captions, :meth:`CropVerify.verify_caption` finds the objects a caption
mentions (CHAIR's phrase matcher over a synonym table: the world's by default, COCO's or
any other by argument), asks an existence question about each through :meth:`answer` --
so the same gate, views and policy apply -- and reports the mentions the model does not
confirm.

With ``tau = 1`` no view can reach the threshold: the answers are the unmitigated ones
and no extra pass runs (no image is too small to answer, and ``stats["queries"]`` counts
them, on both routes). ``stats`` reports how often verification ran and overturned.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from PIL import Image

from evaluators.answers import existence_subject, parse_yes_no
from evaluators.world.views import check_margin, cluster_box, crop_box, pixel_bounds

from hooks import resolve
from hooks.layout import FULL, visible_box
from hooks.cache import output_cache
from hooks.prompting import user_prompt

from .answer_kinds import answer_kind, count_value
from .base import Mitigation, attached, check_conflicts, register
from .checks import real
from .localize import (
    GENERIC_PROMPT, HEADS, QUERIES, attention_boxes, boxes_from_maps, capture_first_pass, generic_queries,
    image_attention_maps, name_matches, object_in_question, object_token_mask,
)
from .localize_embedding import capture_embeddings, embedding_maps, peak_box, tile_boxes
from .localize_prefix import generic_maps_from_cache
from .spans import find_prior_spans
from .which_image import EXISTENCE_TEMPLATE, AnyImage, WhichImage, decide, parse_multi_image

#: The views a query can be re-asked on: DO-Bench's Crop and Cluster, and "pair" -- the
#: original and its Crop view as two images of one prompt (issue 6's [original, crop], for
#: models that take several images; the crop adds resolution without losing the context).
VIEWS = ("crop", "cluster", "pair")

#: How the object is found without a ``localizer``: the model's attention (ViCrop,
#: :mod:`mitigate.localize`), its input embeddings over the whole image, or the same
#: embeddings read on ``zoom_grid`` x ``zoom_grid`` tiles, each at the model's input
#: resolution (:mod:`mitigate.localize_embedding`).
LOCATE = ("attention", "embedding", "zoom")

#: ``which_image`` settings: off; ``True`` -- only an unconfident "none of the above" is
#: checked, and an image answer is final; ``"decompose"`` -- every unconfident answer is
#: replaced by the per-image decision (:meth:`CropVerify.answer_which_image`).
WHICH_IMAGE = (False, True, "decompose")


def control_box(box: tuple, width: int, height: int) -> tuple[float, float, float, float]:
    """A window of ``box``'s size placed as far from it as the image allows: of the four
    corner placements, the one whose centre is farthest from ``box``'s centre. The control
    view: what the model says on a same-sized cut of somewhere else (deterministic)."""
    x0, y0, x1, y1 = box
    w, h = min(x1 - x0, width), min(y1 - y0, height)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    corners = [(0.0, 0.0), (width - w, 0.0), (0.0, height - h), (width - w, height - h)]
    left, top = max(corners, key=lambda c: (c[0] + w / 2 - cx) ** 2 + (c[1] + h / 2 - cy) ** 2)
    return (float(left), float(top), float(left + w), float(top + h))


#: The smallest image side crop-and-verify cuts views from (our choice: a view of a smaller
#: image is a few pixels of interpolation, whatever the margin).
MIN_VIEW_SIDE = 8

#: The existence question asked about each caption mention; ``{object}`` is the category.
MENTION_QUESTION = "Is there a {object} in the image? Answer yes or no."


def ask_by_limit(limits: Sequence, k: int, ask: Callable[[list[int], Any], list]) -> list:
    """Re-ask the ``k`` views of each verified query, one ``ask(queries, limit)`` call per
    distinct token limit in ``limits`` (one per query): a yes/no question's views need one
    token where a count's need its words (:attr:`CropVerify.yes_no_view_tokens`). ``ask``
    returns one item per view row of its queries, in order; the items come back in query
    order, ``k`` per query. A batch of one kind is one call, as before the split."""
    items: list = [None] * (len(limits) * k)
    for limit in dict.fromkeys(limits):  # first-seen order: deterministic
        queries = [j for j, other in enumerate(limits) if other == limit]
        got = ask(queries, limit)
        for n, j in enumerate(queries):
            items[j * k : (j + 1) * k] = got[n * k : (n + 1) * k]
    return items


def with_settings(image_processor: Any, settings: dict | None) -> Any:
    """``image_processor`` as a preprocess call with keyword ``settings`` runs it: a shallow
    copy with those of its attributes the call overrode (``do_center_crop``, ``size`` ...)."""
    if image_processor is None or not settings:
        return image_processor
    applied = copy.copy(image_processor)
    for name, value in settings.items():
        if value is not None and hasattr(applied, name):
            setattr(applied, name, value)
    return applied


def view_image(image: Image.Image, box: tuple, shown: tuple = FULL) -> Image.Image:
    """The view of ``image`` inside ``box``: cut from the original, then resized back to the
    original's size (bicubic). Both routes ask the model this one image -- ``answer()`` and
    the ``generate()`` path, which needs the resize so that the family's processor gives a
    view exactly as many image tokens as its original and the caller's prompt ids can be
    reused (``tests/test_crop_verify_generate.py`` checks the count on every family).

    ``shown``: the part of an image of the original's size that the processor keeps
    (:func:`hooks.layout.visible_box`; :data:`hooks.layout.FULL` for most processors). A
    CLIP-style processor (LLaVA-1.5's) cuts the centre square of what it is given, so a
    square view stretched to a 640 x 480 original's size would lose 12.5% of its width on
    each side -- a small object at the crop's edge cut away with it. There the view is
    framed instead (:func:`view_source`): the original's pixels around the box are taken
    with it, so that what the processor keeps is exactly the box, at the original's aspect
    (no stretch for a square box on a centre-square processor). The frame's part past the
    image is black, and lies where the processor cuts (a padding processor's ``shown``
    reaching past the image is clipped to it: everything it is given is shown)."""
    window = pixel_bounds(box, image.width, image.height)
    if tuple(shown) == FULL:
        return image.crop(window).resize(image.size, Image.BICUBIC)
    x0, y0, x1, y1 = view_source(window, shown)
    # the frame's whole pixels (crop fills what lies past the image with black), then its
    # fractional box resized: resize's box must lie inside the image it resizes
    fx0, fy0 = math.floor(x0), math.floor(y0)
    frame = image.crop((fx0, fy0, math.ceil(x1), math.ceil(y1)))
    return frame.resize(image.size, Image.BICUBIC, box=(x0 - fx0, y0 - fy0, x1 - fx0, y1 - fy0))


def view_source(window: tuple, shown: tuple) -> tuple[float, float, float, float]:
    """The region of the original (pixels, may reach past it) whose resize to the original's
    size puts ``window`` exactly on ``shown``, the part of that size a processor keeps
    (fractions, clipped to [0, 1]): on each axis the window's length over the shown
    fraction, starting the shown fraction's offset before the window."""
    sx0, sy0, sx1, sy1 = max(shown[0], 0.0), max(shown[1], 0.0), min(shown[2], 1.0), min(shown[3], 1.0)
    if not (sx1 > sx0 and sy1 > sy0):
        raise ValueError(f"shown {shown!r} keeps no part of the image")
    out = []
    for lo, hi, a, b in ((window[0], window[2], sx0, sx1), (window[1], window[3], sy0, sy1)):
        length = (hi - lo) / (b - a)
        out.append((lo - a * length, lo - a * length + length))
    (x0, x1), (y0, y1) = out
    return (x0, y0, x1, y1)


def emitted_probability(probs: torch.Tensor, first_tokens: torch.Tensor) -> torch.Tensor:
    """The first-step probability of the token each row emitted: its answer's confidence.
    Under greedy decoding the top-1 probability; under sampling the sampled token's, not
    that of a token the answer does not start with -- comparing top-1s had let a view of
    the whole image (its distribution the first answer's) replace a sampled answer with
    another sample on float noise."""
    return probs.gather(-1, first_tokens.reshape(-1, 1).to(probs.device)).squeeze(-1)


def _yes_evidence(record: dict) -> float | None:
    """How strongly a per-image :meth:`CropVerify.answer` record says "yes": the p(yes) of
    the view that overturned its "no", or the confidence of a first answer that was "yes";
    None when its final answer is not "yes"."""
    if parse_yes_no(record["answer"]) is not True:
        return None
    if record.get("chosen"):
        return record["views"][record["chosen"]]["p_yes"]
    return record["confidence"]


def without_priors(prompt: str) -> str:
    """``prompt`` without the belief / assertion sentences :func:`mitigate.spans.find_prior_spans`
    finds in it (spaces between the remaining sentences normalised); unchanged if none."""
    spans = find_prior_spans(prompt)
    for span in sorted(spans, key=lambda s: s.start, reverse=True):
        prompt = prompt[: span.start] + " " + prompt[span.end :]
    stripped = " ".join(prompt.split()) if spans else prompt
    return stripped or prompt  # a prompt that is all belief keeps it: there is nothing else to ask


@register
@dataclass
class CropVerify(Mitigation):
    """``CropVerify(processor, tau=0.8, gate=0.9, margin=0.1, views=("crop", "cluster"), control=False)``.

    ``tau`` = 0.8 (session 40; 0.5 before): issue 6 allows the false "yes" on absent objects
    (DO-Bench's B-series) to rise by at most 3 points, and on the organism the default
    localiser at 0.5 raised it by +12.5, +7.5, +2.5 and +7.5 points on four sets of 40 scene
    groups (suite seeds 0-3). 0.8 is the lowest threshold within 3 points on seeds 0 and 1
    (0.6 and 0.7: +5.0 on seed 1), and held on seeds 2 and 3, not used to choose it (+0.0
    both); the price is a smaller gain on the level-0 false "no" (-5.6 points pooled over the
    four sets, against -14.4 at 0.5). ``docs/results/crop_verify_locate.md``, session 40.

    ``views``: a non-empty subset of :data:`VIEWS`; ``control``: also ask a same-size window
    away from the object and overturn only when a view beats it (module docstring);
    ``which_image`` (:data:`WHICH_IMAGE`): let the evaluators send multi-image "in which
    image is there ...?" questions to :meth:`answer_which_image` (off by default), checking
    only an unconfident "none of the above" (``True``) or re-deriving every
    unconfident answer from the images asked one by one (``"decompose"``).

    Localisation: ``locate`` (:data:`LOCATE`): ``"attention"`` (default) reads ``layers``
    (default: ViCrop's middle layers), ``queries`` (``"last"``, ``"question"`` or
    ``"object"``), ``heads`` (``"mean"`` or ``"peak"``) and ``generic_prompt`` (ViCrop's
    normalising prompt; None reads the raw map and skips that row) -- see
    :mod:`mitigate.localize`; ``"embedding"`` and ``"zoom"`` (with ``zoom_grid``, the tiles per
    side) ignore those four and need each prompt to name its object
    (:mod:`mitigate.localize_embedding`). ``localizer`` replaces all three with a detector
    callable.
    """

    processor: Any = field(repr=False)  # results.json records the config, not the processor (its repr holds paths)
    tau: float = 0.8  # a view's "yes" must beat it to overturn a "no" (class docstring: why 0.8)
    gate: float = 0.9
    margin: float = 0.1
    views: Sequence[str] = ("crop", "cluster")
    control: bool = False  # also ask a same-size window away from the object (control_box)
    layers: Sequence[int] | None = None
    queries: str = "last"  # "question": the text after the image; "object": the object's tokens
    heads: str = "mean"  # "peak": per query, the most concentrated head (see localize)
    generic_prompt: str | None = GENERIC_PROMPT
    locate: str = "attention"  # "embedding" / "zoom": the image tokens nearest the object's name (localize_embedding)
    zoom_grid: int = 2  # locate="zoom": the image is searched in zoom_grid x zoom_grid tiles
    strip_priors: bool = True  # re-ask the views without the prompt's belief / assertion sentences
    # route multi-image "in which image is there ...?" questions to answer_which_image where a
    # caller dispatches by query (evaluators.model.HFModel); off by default, because on the
    # organism it also turns correct "none"s into images (docs/results/crop_verify_which_image.md);
    # "decompose" also re-derives unconfident image answers (WHICH_IMAGE)
    which_image: bool | str = False
    localizer: Callable[[Image.Image, str], tuple] | None = None
    # the views of a yes/no question answer with this many tokens (None: the call's
    # max_new_tokens); the policy reads only their first token (view_tokens)
    yes_no_view_tokens: int | None = 1
    # attach(): the originals of the attached processor's last keep_originals preprocess calls are
    # kept for generate() to find (each holds its images); left out of the repr, as it does not
    # change an answer the views can give, only whether a call preprocessed long before is verified
    keep_originals: int = field(default=16, repr=False)
    stats: dict = field(default_factory=lambda: {"queries": 0, "verified": 0, "overturned": 0}, repr=False)

    name = "crop_verify"
    #: its generate() reads the plain call's per-row output; continuous batching returns none
    continuous_batching = False
    one_per_attach = True  # it wraps generate() and the processor's preprocess

    def __post_init__(self) -> None:
        if not isinstance(self.control, bool):
            raise ValueError(f"control must be True or False, got {self.control!r}")
        self.tau = real(self.tau, "tau", "in [0, 1]", lambda v: 0.0 <= v <= 1.0)
        self.gate = real(self.gate, "gate", "in [0, 1]", lambda v: 0.0 <= v <= 1.0)
        check_margin(self.margin)
        if isinstance(self.views, str):  # "crop+pair", as a command-line spec gives it
            self.views = tuple(v.strip() for v in self.views.split("+"))
        unknown = [v for v in self.views if v not in VIEWS]
        if unknown or not self.views:
            raise ValueError(f"views must be a non-empty subset of {VIEWS}, got {list(self.views)!r}")
        if self.queries not in QUERIES:
            raise ValueError(f"queries must be one of {QUERIES}, got {self.queries!r}")
        if self.heads not in HEADS:
            raise ValueError(f"heads must be one of {HEADS}, got {self.heads!r}")
        if self.locate not in LOCATE:
            raise ValueError(f"locate must be one of {LOCATE}, got {self.locate!r}")
        tile_boxes(1, 1, self.zoom_grid)  # a clear error for a bad zoom_grid
        if not (isinstance(self.which_image, bool) or self.which_image == "decompose"):  # WHICH_IMAGE; 1 is not True
            raise ValueError(f"which_image must be one of {WHICH_IMAGE}, got {self.which_image!r}")
        if not isinstance(self.strip_priors, bool):
            raise ValueError(f"strip_priors must be True or False, got {self.strip_priors!r}")
        if self.generic_prompt is not None and (not isinstance(self.generic_prompt, str) or not self.generic_prompt.strip()):
            raise ValueError(f"generic_prompt must be a non-empty string or None, got {self.generic_prompt!r}")
        if isinstance(self.layers, int):  # one layer, as a command-line spec gives it
            self.layers = [self.layers]
        if self.localizer is not None and not callable(self.localizer):
            raise ValueError("localizer must be callable: localizer(image, prompt) -> (x0, y0, x1, y1)")
        if self.yes_no_view_tokens is not None and (not isinstance(self.yes_no_view_tokens, int)
                                                    or isinstance(self.yes_no_view_tokens, bool)
                                                    or self.yes_no_view_tokens < 1):
            raise ValueError(f"yes_no_view_tokens must be an int >= 1 or None, got {self.yes_no_view_tokens!r}")
        if not isinstance(self.keep_originals, int) or isinstance(self.keep_originals, bool) or self.keep_originals < 1:
            raise ValueError(f"keep_originals must be an int >= 1, got {self.keep_originals!r}")
        if self.localizer is not None and self.locate != "attention":
            raise ValueError(f"localizer and locate={self.locate!r} both say where to cut the views: give one")

    def conflict(self, other: Mitigation) -> str | None:
        if other.name == self.name and other is not self:  # both would wrap generate() and capture attention
            return "one crop-and-verify per model: each wraps generate() and captures attention; detach the other"
        return None

    # -- attach(): plain generate() and pipelines ---------------------------------------------
    def validate(self, points) -> None:
        if "pair" in self.views:
            raise ValueError("the 'pair' view puts two images in one prompt: use CropVerify.answer(), not attach()")
        for part in ("tokenizer", "image_processor"):
            if getattr(self.processor, part, None) is None:
                raise ValueError(f"attach(model, CropVerify(processor)) needs the model's processor (with its {part})")

    def attach_hooks(self, points, group) -> None:
        """Under :func:`mitigate.attach`, ``model.generate()`` verifies its own answers
        (:mod:`mitigate.crop_verify_generate`)."""
        from .crop_verify_generate import attach_verified_generate

        attach_verified_generate(self, points, group)

    # -- plumbing -----------------------------------------------------------------------
    def _inputs(self, images: list, prompts: list[str], model) -> dict:
        """One prompt per entry of ``images``: an image, or a list of images (the "pair" view)."""
        groups = [im if isinstance(im, list) else [im] for im in images]
        texts = [user_prompt(self.processor, p, len(g)) for g, p in zip(groups, prompts)]
        # nested per prompt: some processors (Gemma3's) read a flat list as one prompt's images
        return self.processor(text=texts, images=groups, return_tensors="pt", padding=True).to(model.device)

    def _generate(self, model, images, prompts, max_new_tokens: int, generate_kwargs: dict,
                  capture_objects: Sequence[str | None] | None = None, strict: bool = False):
        """Texts, first-step probabilities and each answer's confidence
        (:func:`emitted_probability`); with ``capture_objects`` (one object or None
        per prompt) also the encoded inputs and what :meth:`capture` took at the prefill of
        this very ``generate()`` (``"maps"``: each row's localisation map)."""
        enc = self._inputs(images, prompts, model)
        # the first step's logits are read from a dict output: set here whatever the caller passed.
        # The model's own distribution (output_logits), not the scores after temperature / top-k /
        # top-p: confidences and tau mean the same whatever the decoding settings
        kwargs = {"do_sample": False, **generate_kwargs, "max_new_tokens": max_new_tokens, "output_logits": True,
                  "return_dict_in_generate": True}
        if capture_objects is None:
            out = model.generate(**enc, **kwargs)
        else:
            with self.capture(model, enc, capture_objects, strict=strict) as captured:
                out = model.generate(**enc, **kwargs)
            if self.locate == "attention" and self.generic_prompt is not None:
                captured["cache"] = output_cache(out)  # the generic prompt reuses its prefix
        start = enc["input_ids"].shape[1]
        texts = [t.strip() for t in self.processor.batch_decode(out.sequences[:, start:], skip_special_tokens=True)]
        probs = torch.softmax(out.logits[0].float(), dim=-1)
        confidence = emitted_probability(probs, out.sequences[:, start])
        if capture_objects is None:
            return texts, probs, confidence
        return texts, probs, confidence, enc, captured

    def _word_ids(self, word: str) -> list[int]:
        tok = self.processor.tokenizer
        ids = set()
        for variant in (word, " " + word, word.capitalize(), " " + word.capitalize()):
            enc = tok(variant, add_special_tokens=False)["input_ids"]
            if len(enc) == 1:
                ids.add(enc[0])
        return sorted(ids)

    def _p_yes(self, probs: torch.Tensor) -> torch.Tensor:
        ids = self._word_ids("yes")
        return probs[:, ids].sum(-1) if ids else torch.zeros(probs.shape[0], device=probs.device)

    def box(self, model, image: Image.Image, prompt: str, obj: str | None = None) -> tuple[float, float, float, float]:
        """The queried object's box in ``image`` (original pixels); ``obj`` names the object
        for ``queries="object"`` (default: read from the question)."""
        return self.boxes(model, [image], [prompt], None if obj is None else [obj])[0]

    def _objects(self, prompts: list[str], objects: Sequence[str | None] | None) -> list[str]:
        if objects is None:
            objects = [object_in_question(p) for p in prompts]
            missing = [p for p, o in zip(prompts, objects) if o is None]
            if missing:
                setting = f"locate={self.locate!r}" if self.locate != "attention" else "queries='object'"
                raise ValueError(
                    f"{setting} needs the object each prompt asks about; none found in {missing[0]!r}: "
                    "pass objects=[...] (one per prompt)")
        elif len(objects) != len(prompts):
            raise ValueError(f"objects: {len(objects)} given for {len(prompts)} prompts")
        return list(objects)

    def boxes(self, model, images: list[Image.Image], prompts: list[str],
              objects: Sequence[str | None] | None = None) -> list[tuple[float, float, float, float]]:
        """:meth:`box` for several queries, localised in one batched forward (each query's
        row beside its generic-prompt row, when attention is read with a generic prompt)."""
        if self.localizer is not None:
            return self.detector_boxes(images, prompts)
        if self.locate == "zoom":
            boxes = self.zoom_boxes(model, images, prompts, self._objects(prompts, objects), strict=objects is not None)
            if any(b is None for b in boxes):
                raise ValueError(f"locate='zoom': the object of prompt {boxes.index(None)} is not among its tokens")
            return boxes
        if self.locate == "embedding":
            enc = dict(self._inputs(images, prompts, model))
            maps = embedding_maps(model, enc, self._object_mask(model, enc, self._objects(prompts, objects)))
            return self.boxes_from_capture(model, enc, maps, list(range(len(images))), images)
        per = 1 if self.generic_prompt is None else 2
        rows_images = [im for im in images for _ in range(per)]
        rows_prompts = [q for p in prompts for q in (p, self.generic_prompt)[:per]]
        enc = dict(self._inputs(rows_images, rows_prompts, model))
        points, object_mask = resolve(model), None
        if self.queries == "object":
            named = self._objects(prompts, objects)
            object_mask = object_token_mask(self.processor.tokenizer, points, enc["input_ids"],
                                            [o for obj in named for o in (obj, None)[:per]])
        return attention_boxes(model, enc, [im.size for im in images], layers=self.layers, queries=self.queries,
                               heads=self.heads, object_mask=object_mask, generic_rows=per == 2,
                               shown=self.shown(points, images))

    # -- the mitigation -------------------------------------------------------------------
    @torch.no_grad()
    def answer(self, model, images: list[Image.Image], prompts: list[str], *, max_new_tokens: int = 8,
               objects: Sequence[str | None] | None = None, **generate_kwargs) -> list[dict]:
        """Answers for one image per prompt, with what verification did for each. Each
        prompt is the question as plain text: the chat template (or, for a processor without
        one, the image placeholder) is applied here (:func:`hooks.prompting.user_prompt`).
        ``objects`` names each prompt's object for ``queries="object"`` (default: read from
        the question, :func:`mitigate.localize.object_in_question`). A name given here must
        be found among its prompt's tokens (else a ``ValueError``); one read from the question
        that is not (words the tokenizer does not know) is counted in
        ``stats["object_not_found"]`` and its query left unverified (``locate="embedding"`` /
        ``"zoom"``) or read at its last token (``queries="object"``)."""
        return self._answer(model, images, prompts, max_new_tokens, objects, objects is not None, generate_kwargs)

    def _answer(self, model, images, prompts, max_new_tokens: int, objects, strict: bool,
                generate_kwargs: dict) -> list[dict]:
        """:meth:`answer`; ``strict``: ``objects`` were named by the caller and must be found.
        The questions this class writes itself (:meth:`verify_caption`,
        :meth:`answer_which_image`) pass their objects leniently: a name in words the
        tokenizer does not know is counted, as one read from the question is."""
        check_conflicts([self], attached(model))  # as attach() would: it runs the model itself
        for name, value in (("images", images), ("prompts", prompts)):
            if isinstance(value, (str, Image.Image)) or not isinstance(value, Sequence):
                # a lone prompt was read character by character ("differ in number: 1 vs 49")
                raise ValueError(f"{name} must be a list (one entry per question), got a {type(value).__name__}: "
                                 f"answer(model, [image], [prompt])")
        if len(images) != len(prompts):
            raise ValueError(f"images and prompts differ in number: {len(images)} vs {len(prompts)}")
        if objects is not None and len(objects) != len(prompts):
            raise ValueError(f"objects: {len(objects)} given for {len(prompts)} prompts")
        if not images or any(not isinstance(im, Image.Image) for im in images):
            raise ValueError("crop-and-verify needs one PIL image per prompt (the original, full-resolution image)")
        if self.tau < 1.0:  # with tau = 1 no view is cut: the unmitigated answers, whatever the size
            self.check_view_size(images)
        for key in ("num_beams", "num_return_sequences"):  # one answer per row is verified
            if (generate_kwargs.get(key) or 1) > 1:
                raise ValueError(f"crop-and-verify verifies one answer per row; {key}={generate_kwargs[key]} "
                                 "is not supported")
        localise = self.localizer is None and self.tau < 1.0
        if localise and strict:  # names the caller gave must be in their prompts, gated or not
            for row, (obj, prompt) in enumerate(zip(objects, prompts)):
                if obj is not None and not name_matches(str(obj), prompt):
                    raise ValueError(f"objects: {obj!r} does not occur in the prompt of row {row}: {prompt!r}")
        capture = localise and self.locate != "zoom"  # zoom searches tiles after the gate instead
        named = None
        if localise:  # the object each prompt names (None: queries="object" reads its last token)
            named = list(objects) if objects is not None else [object_in_question(p) for p in prompts]
        first = self._generate(model, images, prompts, max_new_tokens, generate_kwargs,
                               capture_objects=named if capture else None, strict=strict)
        texts, probs, confidence = first[:3]
        results = []
        for i in range(len(images)):
            results.append({"answer": texts[i], "first_answer": texts[i], "confidence": float(confidence[i]),
                            "verified": False, "views": {}})
            self.stats["queries"] += 1
        # only answers a view can change are re-asked (a first "yes", a box, free text are
        # final, so their views would be wasted passes)
        gated = self.gate_rows(texts, confidence, prompts)
        if gated and capture and self.locate == "embedding":
            gated, _ = self.located(gated, [first[4]["maps"][i] for i in gated])
        elif gated and capture:
            self.count_unnamed(gated, first[4])
        boxes = []
        if gated and localise and self.locate == "zoom":  # rows whose object is not found stay unverified
            searched = self.zoom_boxes(model, [images[i] for i in gated], [prompts[i] for i in gated],
                                       [named[i] for i in gated], strict=strict)
            gated, boxes = self.located(gated, searched)
        if gated:  # the extra passes, batched over every query that needs them
            if capture:
                boxes = self._captured_boxes(model, first[3], first[4], gated, [images[i] for i in gated],
                                             [prompts[i] for i in gated], [named[i] for i in gated])
            elif not localise:
                boxes = self.detector_boxes([images[i] for i in gated], [prompts[i] for i in gated])
            self._verify([images[i] for i in gated], [prompts[i] for i in gated], [results[i] for i in gated],
                         model, max_new_tokens, generate_kwargs, boxes)
        return results

    @torch.no_grad()
    def answer_which_image(self, model, image_sets: list[list[Image.Image]], prompts: list[str], *,
                           max_new_tokens: int = 8, template: str = EXISTENCE_TEMPLATE, **generate_kwargs) -> list[dict]:
        """Answers to multi-image "in which image is there an X?" questions (MIOH's selective
        existence task), each verified image by image -- and to "is there an X in any of
        these images?" (its comprehensive one, yes / no), where each image stands for "yes"
        and "no" plays "none of the above" (:class:`mitigate.which_image.AnyImage`): an
        unconfident "no" is checked image by image and becomes "yes" when an image passes
        ``tau``; under ``"decompose"`` an unconfident "yes" becomes "no" when none does.

        1. **answer** the question on all its images (plain ``generate()``);
        2. **gate**: an unconfident answer (top first-token probability below ``gate``) is
           checked. By default (``which_image=True``, or off when this is
           called directly) only an unconfident "none of the above": an image answer is
           never overturned, because a view is evidence of what is there, never of what is
           not (the same rule as for a "no"). Under ``which_image="decompose"`` every
           unconfident answer, image answers and unreadable ones included;
        3. **decompose**: ask ``template`` ("is there a banana in the image?") about each
           image alone, through :meth:`answer` -- its first answer on the whole image (MIOH's
           decomposed question) and, when that is an unconfident "no", its Crop / Cluster
           views (DO-Bench); under ``strip_priors=False`` the prompt's belief sentences come
           first (:meth:`image_question`). These yes/no questions answer with
           ``yes_no_view_tokens`` tokens, as the views of a yes/no question do;
        4. **combine**: the answer becomes the option of the image whose final answer is
           "yes" with the most evidence -- the probability of "yes" from the view that said
           it, or the whole image's first-token confidence -- when that evidence is above
           ``tau`` (strict). Under ``"decompose"``, when no image passes ``tau`` the answer
           becomes "none of the above" (kept as it was if the question offers no such
           option). That reads the images' own "no"s as evidence of absence: each is the
           model's answer about a whole image, not about a cut of it, and MIOH (Sec. 5.5,
           Fig. 5) finds every model it tests answers the decomposed questions better than the
           same question over all the images at once -- the paper measures the gap and
           proposes no mitigation; this is our reading of it as one.

        With ``tau = 1`` nothing is gated and the answers are the unmitigated ones. Counted in
        ``stats["which_image"]`` (queries, verified, overturned, images asked); the per-image
        questions do not count in the single-image ``stats``. Each record has ``answer``,
        ``first_answer``, ``confidence``, ``verified``, and for verified ones ``images`` (the
        :meth:`answer` record of each image) and, where the answer changed, ``chosen`` (the
        image's 0-based index, or ``"none"``).
        """
        check_conflicts([self], attached(model))
        for name, value in (("image_sets", image_sets), ("prompts", prompts)):
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise ValueError(f"{name} must be a list (one entry per question), got a {type(value).__name__}")
        if len(image_sets) != len(prompts):
            raise ValueError(f"image_sets and prompts differ in number: {len(image_sets)} vs {len(prompts)}")
        if not image_sets or any(not isinstance(s, (list, tuple)) or not s or
                                 any(not isinstance(im, Image.Image) for im in s) for s in image_sets):
            raise ValueError("answer_which_image needs a non-empty list of PIL images per prompt")
        if "{object}" not in template:
            raise ValueError(f"template must contain '{{object}}', got {template!r}")
        parsed = [parse_multi_image(p, len(s)) for s, p in zip(image_sets, prompts)]
        unread = [p for p, w in zip(prompts, parsed) if w is None]
        if unread:
            raise ValueError("neither an 'in which image is there ...' question with one option per image (and "
                             "'none of the above' at most once) nor an 'is there ... in the images ?' question over "
                             f"two or more images: {unread[0]!r}")
        if self.tau < 1.0:
            self.check_view_size([im for s in image_sets for im in s])
        texts, _, confidence = self._generate(model, [list(s) for s in image_sets], prompts, max_new_tokens,
                                              generate_kwargs)
        stats = self.stats.setdefault("which_image", {"queries": 0, "verified": 0, "overturned": 0, "images_asked": 0})
        stats["queries"] += len(prompts)
        results = [{"answer": t, "first_answer": t, "confidence": float(c), "verified": False}
                   for t, c in zip(texts, confidence)]
        decompose = self.which_image == "decompose"
        gated = [i for i, (w, r) in enumerate(zip(parsed, results))
                 if self.tau < 1.0 and r["confidence"] < self.gate
                 and (decompose or (w.none is not None and w.choice(r["answer"]) == w.none))]
        if not gated:
            return results
        asked = [(i, k) for i in gated for k in sorted(parsed[i].letters)]
        # the same configuration with counters of its own: the per-image questions are not
        # single-image queries of the caller's
        per_image = replace(self, stats={"queries": 0, "verified": 0, "overturned": 0})
        # yes/no questions of our own (their records are returned in result["images"]), read
        # from their first token as the views of a yes/no question are (yes_no_view_tokens)
        # their objects are read from the questions: one the tokenizer does not know leaves its
        # image unverified (counted), it does not stop the batch
        records = per_image._answer(model, [image_sets[i][k] for i, k in asked],
                                    [self.image_question(prompts[i], parsed[i], template) for i, _ in asked],
                                    self.view_tokens("yes_no", max_new_tokens, generate_kwargs.get("min_new_tokens")),
                                    [parsed[i].object for i, _ in asked], False, generate_kwargs)
        if per_image.stats.get("object_not_found"):
            stats["object_not_found"] = stats.get("object_not_found", 0) + per_image.stats["object_not_found"]
        stats["verified"] += len(gated)
        stats["images_asked"] += len(asked)
        per_query: dict[int, dict[int, dict]] = {}
        for (i, k), record in zip(asked, records):
            per_query.setdefault(i, {})[k] = record
        for i, by_image in per_query.items():
            result, which = results[i], parsed[i]
            result["verified"], result["images"] = True, by_image
            chosen = decide(which, {k: _yes_evidence(r) for k, r in by_image.items()}, self.tau, decompose)
            if chosen is None:
                continue
            letter = which.none if chosen == "none" else which.letters[chosen]
            if which.choice(result["answer"]) != letter:
                result["answer"], result["chosen"] = which.answer_with(letter), chosen
                stats["overturned"] += 1
        return results

    def image_question(self, prompt: str, which: WhichImage | AnyImage, template: str = EXISTENCE_TEMPLATE) -> str:
        """The question :meth:`answer_which_image` asks of each image alone: ``template``
        about the queried object, after the prompt's belief / assertion sentences
        (:func:`mitigate.spans.find_prior_spans`) unless ``strip_priors`` -- the same choice
        the views' prompts get, so that ``strip_priors=False`` keeps a prompt's pressure in
        every question asked on its behalf (MIOH's LC-S / LC-I sentences included)."""
        question = which.question(template)
        if self.strip_priors:
            return question
        priors = " ".join(prompt[s.start : s.end].strip() for s in find_prior_spans(prompt))
        return f"{priors} {question}" if priors else question

    def _captured_boxes(self, model, enc, captured, rows, images, prompts, named) -> list[tuple]:
        """Boxes for ``rows`` of the first pass, from the maps captured at its prefill (a
        clear error first if a row's prompt names no object and localisation needs one)."""
        if self.queries == "object" and self.locate == "attention":
            self._objects([p for p, o in zip(prompts, named) if o is None], None)
        # popped: the first pass's cache is not held through the views' generate()
        return self.boxes_from_capture(model, enc, captured["maps"], rows, images, cache=captured.pop("cache", None))

    def shown(self, points, images: Sequence[Image.Image], settings: dict | None = None) -> list[tuple]:
        """Per image, the part of it the processor's output shows (:func:`hooks.layout.visible_box`:
        all of it, or a CLIP processor's centre crop), where localisation paints the maps
        (``points``: the model's :class:`hooks.ModelPoints`, for its token layout).
        ``settings``: the keyword settings the caller's preprocess call overrode (under
        ``generate()``), which decide the crop as the processor's own attributes do."""
        image_processor = with_settings(getattr(self.processor, "image_processor", None), settings)
        return [visible_box(image_processor, im.size, points.adapter.token_layout) for im in images]

    def shown_for(self, model, images: Sequence[Image.Image]) -> list[tuple]:
        """:meth:`shown`, resolving ``model`` only where the processor may show part of an
        image (a centre crop or a pad, which only the ``grid`` layout reads): a caller's
        detector boxes need no hook points, and a model the hooks refuse keeps its views."""
        image_processor = getattr(self.processor, "image_processor", None)
        if all(visible_box(image_processor, im.size) == FULL for im in images):
            return [FULL] * len(images)
        return self.shown(resolve(model), images)

    def needs_objects(self) -> bool:
        """Whether localisation reads the prompt tokens that name each query's object."""
        return self.locate in ("embedding", "zoom") or self.queries == "object"

    def capture(self, model, inputs: dict, objects: Sequence[str | None] | None, strict: bool = False):
        """A context manager that captures each row's localisation map at the prefill of
        whatever runs the model inside it (the first answer's own ``generate()``, left
        unchanged) and fills the ``"maps"`` of the dict it yields on exit: attention
        (:func:`mitigate.localize.capture_first_pass`) or, under ``locate="embedding"``, the
        similarity to the object's name (:func:`mitigate.localize_embedding.capture_embeddings`;
        ``objects`` names one object or None per row). Objects read from the questions are
        matched leniently: a row whose object's words the tokenizer does not know must not
        stop the batch (it gets no map under "embedding", its last token under
        queries="object"); ``strict=True`` (objects the caller named) makes it an error."""
        if self.locate == "embedding":
            return capture_embeddings(model, inputs, self._object_mask(model, inputs, objects, strict=strict))
        return capture_first_pass(model, inputs, layers=self.layers, queries=self.queries, objects=objects,
                                  tokenizer=self.processor.tokenizer, strict=strict)

    def _object_mask(self, model, inputs: dict, objects: Sequence[str | None], strict: bool = True) -> torch.Tensor:
        return object_token_mask(self.processor.tokenizer, resolve(model), inputs["input_ids"], objects, strict)

    def not_found(self, count: int) -> None:
        """Count ``count`` queries whose object localisation could not find by name."""
        if count:
            self.stats["object_not_found"] = self.stats.get("object_not_found", 0) + count

    def located(self, rows: Sequence[int], found: Sequence) -> tuple[list[int], list]:
        """``rows`` and what localisation ``found`` for each (a map, a box), without the rows
        it found nothing for -- under ``locate="embedding"`` / ``"zoom"``, a prompt that names
        no object, or names it in words the tokenizer does not know: those are left
        unverified and counted in ``stats["object_not_found"]``."""
        kept = [(r, f) for r, f in zip(rows, found) if f is not None]
        self.not_found(len(rows) - len(kept))
        return [r for r, _ in kept], [f for _, f in kept]

    def count_unnamed(self, rows: Sequence[int], captured: dict) -> None:
        """Under ``queries="object"``: count the ``rows`` whose object was named by the
        question in words the tokenizer does not know (their attention is read at the last
        token instead)."""
        self.not_found(len(set(captured.get("unnamed", ())) & set(rows)))

    def zoom_boxes(self, model, images: Sequence[Image.Image], prompts: Sequence[str],
                   objects: Sequence[str | None], strict: bool = False, tile_inputs: Callable | None = None,
                   settings: dict | None = None) -> list:
        """``locate="zoom"``: each image is cut into ``zoom_grid`` x ``zoom_grid`` tiles, each
        resized to the image's size as a view is (:func:`view_image`), and asked with its
        prompt in one batch that stops at the decoder's input
        (:func:`mitigate.localize_embedding.embedding_maps`); the box is a square around the
        image token most similar to the object's name over all tiles
        (:func:`mitigate.localize_embedding.peak_box`). One box per query, or None where the
        prompt names no object the tokenizer knows. ``tile_inputs(rows, tile_images)``
        builds the model inputs for tile rows (default: the prompts through the processor;
        the ``generate()`` route reuses the caller's prompt ids)."""
        tiles = [tile_boxes(im.width, im.height, self.zoom_grid) for im in images]
        per = len(tiles[0]) if tiles else 0
        points = resolve(model)
        # each tile framed so that what the processor keeps is the tile: its map covers it
        shown = self.shown(points, images, settings)
        tile_images = [view_image(im, t, s) for im, ts, s in zip(images, tiles, shown) for t in ts]
        rows = [q for q in range(len(images)) for _ in range(per)]
        if tile_inputs is None:
            enc = dict(self._inputs(tile_images, [prompts[q] for q in rows], model))
        else:
            enc = tile_inputs(rows, tile_images)
        mask = self._object_mask(model, enc, [objects[q] for q in rows], strict=strict)
        maps = embedding_maps(model, enc, mask, shift=False)
        boxes = []
        for q, image in enumerate(images):
            mine = list(range(q * per, (q + 1) * per))
            if any(maps[r] is None for r in mine):
                boxes.append(None)
            else:
                boxes.append(peak_box(points, [maps[r] for r in mine], enc, mine, tiles[q], image.size))
        return boxes

    def boxes_from_capture(self, model, inputs: dict, maps: Sequence, rows: Sequence[int],
                           images: Sequence[Image.Image], cache=None, settings: dict | None = None) -> list[tuple]:
        """Boxes for ``rows`` of ``inputs`` from the maps :meth:`capture` took of them
        (``images``: those rows' originals). Attention with ViCrop's generic prompt needs its
        map over the same images, for the ratio: read over ``cache`` (the first pass's KV
        cache, :mod:`mitigate.localize_prefix`) where that is exact, else from a forward of
        its own; the embedding maps need none. A row without a map (nothing in its prompt
        names the object) is a ``ValueError``."""
        missing = [r for r in rows if maps[r] is None]
        if missing:
            raise ValueError(f"locate='embedding': the prompt of row {missing[0]} names no object to look for")
        generic = None
        if self.locate == "attention" and self.generic_prompt is not None:
            generic_enc = dict(self._inputs(list(images), [self.generic_prompt] * len(images), model))
            if cache is not None:
                generic = generic_maps_from_cache(model, cache, inputs, list(rows), generic_enc, self.layers,
                                                  generic_queries(self.queries))
            reused = 0 if generic is None else len(rows)
            self.stats["generic_from_cache"] = self.stats.get("generic_from_cache", 0) + reused
            if generic is None:
                generic = image_attention_maps(model, generic_enc, self.layers, generic_queries(self.queries))
        points = resolve(model)
        return boxes_from_maps(points, [maps[r] for r in rows], inputs, list(rows), [im.size for im in images],
                               heads=self.heads if self.locate == "attention" else "mean", generic_maps=generic,
                               shown=self.shown(points, images, settings))

    def _verify(self, images, prompts, results, model, max_new_tokens, generate_kwargs, boxes) -> None:
        view_images, view_prompts, built_all = [], [], []
        if self.strip_priors:
            prompts = [without_priors(p) for p in prompts]
        asked = self.asked_views()
        for image, prompt, box, shown in zip(images, prompts, boxes, self.shown_for(model, images)):
            built = self.view_boxes(image, box)
            built_all.append(built)
            view_images += [[image, view_image(image, built["crop"], shown)] if v == "pair"
                            else view_image(image, built[v], shown) for v in asked]
            view_prompts += [prompt] * len(asked)
        k = len(asked)
        floor = generate_kwargs.get("min_new_tokens")
        limits = [self.view_tokens(answer_kind(r["first_answer"], p), max_new_tokens, floor)
                  for r, p in zip(results, prompts)]

        def ask(queries: list[int], limit: int) -> list:
            rows = [j * k + v for j in queries for v in range(k)]
            texts, probs, confidence = self._generate(model, [view_images[r] for r in rows],
                                                      [view_prompts[r] for r in rows], limit, generate_kwargs)
            return list(zip(texts, probs, confidence))

        items = ask_by_limit(limits, k, ask)
        for j, (result, box, built) in enumerate(zip(results, boxes, built_all)):
            views = items[j * k : (j + 1) * k]
            self._decide(result, box, built, [v[0] for v in views], torch.stack([v[1] for v in views]), prompts[j],
                         confidence=torch.stack([v[2] for v in views]))

    def view_tokens(self, kind: str, max_new_tokens: int | None, min_new_tokens: int | None = None) -> int | None:
        """How many tokens the views of a query whose first answer is of ``kind`` answer
        with: :attr:`yes_no_view_tokens` for a yes/no answer (at least the call's
        ``min_new_tokens``, at most its ``max_new_tokens``), else ``max_new_tokens`` (None:
        the call's own). A yes/no view is read from its first
        token alone -- its p(yes) and whether that token says yes -- so one token decides
        as the whole answer would wherever the answer starts with its yes or no (a view
        answering "Definitely yes" is not counted as a yes), and a model that answers
        "Yes, there is a cat in the image." is not made to write the sentence once per view
        (an overturned answer is then that first token, "Yes")."""
        if kind != "yes_no" or self.yes_no_view_tokens is None:
            return max_new_tokens
        limit = max(self.yes_no_view_tokens, min_new_tokens or 0)
        return limit if max_new_tokens is None else min(limit, max_new_tokens)

    def asked_views(self) -> list[str]:
        """What each verified query is re-asked on, in order: the views, then the control."""
        return [*self.views, *(["control"] if self.control else [])]

    def view_boxes(self, image: Image.Image, box: tuple) -> dict[str, tuple]:
        """Every view's box for the object at ``box`` in ``image`` (DO-Bench's geometry, the
        control window far from the crop); "pair" shows the crop beside the original.

        At inference nothing says where the object's neighbours are (DO-Bench builds its
        Cluster view from annotations), so the Cluster view is :func:`cluster_box`'s rule
        for an object without neighbours: the box padded by twice its longest side, then
        the margin -- the surroundings a neighbour would be in (exact boxes in
        ``tests/test_world.py``)."""
        crop = crop_box(box, image.width, image.height, self.margin)
        return {"crop": crop, "cluster": cluster_box(box, [], image.width, image.height, self.margin),
                "pair": crop, "control": control_box(crop, image.width, image.height)}

    def detector_boxes(self, images: list[Image.Image], prompts: list[str]) -> list[tuple]:
        """The caller's ``localizer`` boxes, as float tuples."""
        return [tuple(float(v) for v in self.localizer(im, p)) for im, p in zip(images, prompts)]

    def check_view_size(self, images: Sequence[Image.Image]) -> None:
        """A clear error for an image too small to cut views from: below :data:`MIN_VIEW_SIDE`
        pixels a side, a view (and its margin) is a few pixels of interpolation."""
        small = [im.size for im in images if min(im.size) < MIN_VIEW_SIDE]
        if small:
            raise ValueError(f"image of size {small[0]} is too small to cut a view with a {self.margin:.0%} margin "
                             f"(crop-and-verify needs at least {MIN_VIEW_SIDE} pixels a side)")

    def gate_rows(self, texts: Sequence[str], confidence: torch.Tensor, questions: Sequence[str]) -> list[int]:
        """The rows whose first answer is re-asked on the views: not confident (top
        first-token probability below ``gate``), not "yes" (never overturned) and of a kind
        a view can change. The unconfident boxes and free-text answers, which no view may
        replace, are counted in ``stats["not_verifiable"]``. None with ``tau = 1``."""
        if self.tau >= 1.0:
            return []
        gated, kept = [], 0
        for row, (text, conf, question) in enumerate(zip(texts, confidence, questions)):
            if float(conf) >= self.gate:
                continue
            kind = answer_kind(text, question)
            if kind in ("box", "free_form"):
                kept += 1
            elif not (kind == "yes_no" and parse_yes_no(text, existence_subject(question)) is True):
                gated.append(row)
        self.stats["not_verifiable"] = self.stats.get("not_verifiable", 0) + kept
        return gated

    def _decide(self, result, box, built, texts, probs, question: str | None = None,
                confidence: torch.Tensor | None = None) -> None:
        """The overturn policy for one query, given what its views answered (``probs``: their
        first-step distributions; ``confidence``: each view answer's
        :func:`emitted_probability`, default the top-1 probability, as under greedy)."""
        p_yes = self._p_yes(probs)
        conf = probs.max(-1).values if confidence is None else confidence
        self.stats["verified"] += 1
        result["verified"] = True
        result["box"] = box
        k = len(self.views)
        result["views"] = {v: {"answer": t, "p_yes": float(p), "confidence": float(c), "box": built[v]}
                           for v, t, p, c in zip(self.views, texts, p_yes, conf)}
        floor = self.tau
        if self.control:  # a view must also beat a same-size cut of somewhere else
            result["control"] = {"answer": texts[k], "p_yes": float(p_yes[k]), "box": built["control"]}
            floor = max(floor, float(p_yes[k]))
        texts, p_yes, conf = texts[:k], p_yes[:k], conf[:k]
        kind = answer_kind(result["first_answer"], question)
        result["kind"] = kind
        if kind == "yes_no":  # only a "no" is ever gated; a view must answer yes, with p(yes) > floor
            subject = existence_subject(question)
            ok = [j for j in range(len(texts)) if parse_yes_no(texts[j], subject) is True and float(p_yes[j]) > floor]
            if ok:
                best = max(ok, key=lambda j: float(p_yes[j]))
                result["answer"], result["chosen"] = texts[best], self.views[best]
                self.stats["overturned"] += 1
            return
        bar = max(self.tau, result["confidence"])
        if kind == "count":  # a view shows at most what the image holds: only a higher count counts
            first = count_value(result["first_answer"])
            ok = [j for j in range(len(texts)) if answer_kind(texts[j], question) == "count"
                  and count_value(texts[j]) > first and float(conf[j]) > bar]
        elif kind == "short":  # an attribute: a confident view's short answer
            ok = [j for j in range(len(texts)) if answer_kind(texts[j], question) == "short" and float(conf[j]) > bar]
        else:  # boxes and free text are never gated (gate_rows); nothing to decide
            ok = []
        if ok:
            best = max(ok, key=lambda j: float(conf[j]))
            result["answer"], result["chosen"] = texts[best], self.views[best]
            self.stats["overturned"] += result["answer"] != result["first_answer"]

    @torch.no_grad()
    def verify_caption(self, model, image: Image.Image, caption: str, *, synonyms: Any = None,
                       question: str = MENTION_QUESTION, max_new_tokens: int = 4, **generate_kwargs) -> dict:
        """Check each object a caption mentions; return which ones the model does not confirm.

        ``synonyms``: a dict ``category -> synonyms``, COCO-style rows or the text of CHAIR's
        ``synonyms.txt`` (default: :data:`evaluators.world.SYNONYMS`, the organism's world).
        Each distinct mentioned category is asked about once, with ``question`` (which must
        contain ``{object}``), through :meth:`answer`; a mention is *confirmed* when the final
        answer parses as yes. The result lists ``mentions`` (in order, repeats kept as CHAIR
        counts them), ``confirmed``, ``unverified`` (categories) and per-category ``details``
        (the :meth:`answer` record, with what the views said).
        """
        from evaluators.benchmarks.causal_halbench.metrics import mentions, synonym_index
        from evaluators.world import SYNONYMS

        if "{object}" not in question:
            raise ValueError(f"question must contain '{{object}}', got {question!r}")
        if not isinstance(caption, str):
            raise ValueError(f"caption must be a string, got {type(caption).__name__}")
        said = mentions(caption, synonym_index(SYNONYMS if synonyms is None else synonyms))
        distinct = list(dict.fromkeys(said))
        details = {}
        if distinct:
            # the categories are ours, not the caller's: one whose words the tokenizer does not
            # know leaves its question unverified (stats["object_not_found"]), as answer() does
            # for an object read from a question
            records = self._answer(model, [image] * len(distinct), [question.format(object=c) for c in distinct],
                                   max_new_tokens, distinct, False, generate_kwargs)
            details = dict(zip(distinct, records))
        confirmed = [c for c in distinct if parse_yes_no(details[c]["answer"]) is True]
        return {"caption": caption, "mentions": said, "confirmed": confirmed,
                "unverified": [c for c in distinct if c not in confirmed], "details": details}
