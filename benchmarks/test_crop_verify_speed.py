"""Crop-and-verify cost on the organism: plain generate() vs CropVerify.answer with its
confidence gate, and vs the same plain call under attach(model, CropVerify(processor)),
on existence questions (issue 6: <= 1.5x plain).

    python -m pytest benchmarks/test_crop_verify_speed.py --benchmark-enable

Batch 8, two sets: DO-Bench's level-0 Full-view questions (built-in suite, seed 0; four
about a small out-of-context present object, four about a typical absent one -- the hard
case crop-and-verify is for) and clean existence questions (large objects, unbiased
scenes); 8 new tokens (an existence answer is one or two). The gate (first-token confidence < 0.9) decides how many queries pay for
localisation and the two views; the share is recorded with the timing. ``crop_verify_embedding``
is ``answer()`` with ``locate="embedding"``, which needs no forward of ViCrop's generic prompt;
``crop_verify_own_generic_forward`` is the default with ViCrop's generic map from a forward of its
own instead of the first answer's cache (:mod:`mitigate.localize_prefix`, session 20);
``crop_verify_embedding_crop`` also asks the Crop view alone; ``crop_verify_crop`` is the default
(ViCrop) with the Crop view alone (session 38: the Cluster view overturned no level-0 denial); ``crop_verify_zoom`` searches 2x2
tiles (vision tower and projector only) instead, ``crop_verify_zoom_crop`` with the Crop view alone;
``crop_verify_full_views`` lets the views of yes/no questions answer at ``max_new_tokens`` as
they did before session 28 (the default reads one token of them).
"""

from __future__ import annotations

import pytest
import torch

from evaluators.benchmarks.dobench.suite import build
from evaluators.organism.package import format_prompt
from evaluators.organism.tasks import existence_question
from evaluators.world import CATEGORIES, UNBIASED, World
from mitigate import CropVerify, attach

NEW_TOKENS = 8


def _questions(kind: str):
    if kind == "dobench_level0":  # small, out-of-context present objects; typical absent ones
        queries = [q for q in build(n_scenes=4, seed=0) if q.record["level"] == 0 and q.record["view"] == "Full"]
        return [q.images[0] for q in queries], [q.prompt for q in queries]
    # clean: large objects in unbiased scenes, one present and one absent category per scene
    world = World(UNBIASED.replace(small_fraction=0.0))
    images, prompts = [], []
    for s in range(4):
        scene = world.scene(2 * 10**9 + s)
        absent = next(c for c in CATEGORIES if not scene.present(c))
        for category in (sorted(scene.categories())[0], absent):
            images.append(scene.render())
            prompts.append(existence_question(category))
    return images, prompts


@pytest.mark.parametrize("kind", ["dobench_level0", "clean"])
@pytest.mark.parametrize("role", ["baseline", "crop_verify", "crop_verify_crop", "crop_verify_own_generic_forward",
                                  "crop_verify_generate",
                                  "crop_verify_embedding", "crop_verify_embedding_crop", "crop_verify_zoom",
                                  "crop_verify_zoom_crop", "crop_verify_full_views"])
def test_crop_verify_speed(benchmark, paired, organism, rounds, role, kind, monkeypatch):
    model, processor = organism
    images, prompts = _questions(kind)
    assert len(images) == 8
    def plain():  # from raw images, as CropVerify.answer is: preprocessing is part of both
        inputs = processor(text=[format_prompt(p) for p in prompts], images=images, return_tensors="pt",
                           padding=True).to(model.device)
        with torch.no_grad():
            return model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)

    benchmark.group = f"crop_verify_{kind}_batch8"
    benchmark.extra_info.update(role=role, tokens=len(prompts))
    if role == "baseline":
        benchmark.pedantic(plain, rounds=rounds, warmup_rounds=2)
        return
    # crop_verify_embedding: answer() with locate="embedding" (no generic-prompt forward);
    # _crop: and the Crop view alone (half the views' rows)
    settings = {"crop_verify_crop": {"views": ("crop",)},
                "crop_verify_embedding": {"locate": "embedding"},
                "crop_verify_embedding_crop": {"locate": "embedding", "views": ("crop",)},
                "crop_verify_zoom": {"locate": "zoom"},
                "crop_verify_zoom_crop": {"locate": "zoom", "views": ("crop",)},
                "crop_verify_full_views": {"yes_no_view_tokens": None}}
    if role == "crop_verify_own_generic_forward":  # the generic map from a forward of its own, not the cache
        import mitigate.crop_verify as module

        monkeypatch.setattr(module, "generic_maps_from_cache", lambda *args, **kwargs: None)
    cv = CropVerify(processor, **settings.get(role, {}))
    if role == "crop_verify_generate":  # attach(): the plain call itself, verified
        out = paired(plain, plain, attach=lambda: attach(model, cv))
    else:
        out = paired(lambda: cv.answer(model, images, prompts, max_new_tokens=NEW_TOKENS), plain)
    assert len(out) == len(prompts)
    benchmark.extra_info.update(verified_share=cv.stats["verified"] / cv.stats["queries"])
