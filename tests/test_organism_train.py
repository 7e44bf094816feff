"""The training recipe's label and view helpers, and its refusal to reuse a stage-1 cache
written by another recipe. (Training itself is minutes of CPU: `python -m evaluators.organism.train`.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evaluators.organism import tasks, train
from evaluators.world import BIASED, Obj, Scene, World

CUP = train.CAT_IDS["cup"]  # drawn as a filled square


def _one_cup(box_side: int = 32, at: int = 32) -> Scene:
    c = at + box_side / 2
    return Scene("kitchen", (Obj(0, "cup", "red", c, c, float(box_side)),), seed=0, resolution=128)


def test_patch_labels_of_the_whole_scene_follow_the_pixels():
    scene = _one_cup()  # pixels 32..63: patches 2..3 of the 8x8 grid (16 source px each)
    cats, cols = train.patch_labels(scene)
    grid = cats.reshape(8, 8)
    expected = np.zeros((8, 8), dtype=np.int64)
    expected[2:4, 2:4] = CUP
    assert (grid == expected).all()
    assert set(cols[cats > 0]) == {train.COL_IDS["red"]}
    same = train.patch_labels(scene, box=(0, 0, 128, 128))
    assert all((a == b).all() for a, b in zip((cats, cols), same))


def test_patch_labels_of_a_zoomed_view_are_those_of_the_cut():
    scene = _one_cup()
    grid = train.patch_labels(scene, box=(32, 32, 64, 64))[0].reshape(8, 8)
    assert (grid == CUP).all()  # the cut is all cup
    grid = train.patch_labels(scene, box=(16, 16, 80, 80))[0].reshape(8, 8)  # 8 source px per patch
    expected = np.zeros((8, 8), dtype=np.int64)
    expected[2:6, 2:6] = CUP
    assert (grid == expected).all()
    # a non-square cut: rows and columns resample separately (the processor stretches it)
    grid = train.patch_labels(scene, box=(32, 0, 64, 128))[0].reshape(8, 8)
    assert (grid[2:4] == CUP).all() and (grid[:2] == 0).all() and (grid[4:] == 0).all()


def test_patch_views_zoom_only_when_asked(monkeypatch):
    world = World(BIASED)
    scenes = [world.scene(i) for i in range(40)]
    rng = np.random.default_rng(0)
    assert all(box is None for _, box in train.patch_views(scenes, rng))
    assert rng.random() == np.random.default_rng(0).random()  # ZOOM = 0 draws nothing
    monkeypatch.setattr(tasks, "ZOOM", 0.5)
    views = train.patch_views(scenes, np.random.default_rng(0))
    zoomed = [(s, box) for s, box in views if box is not None]
    assert 5 <= len(zoomed) <= 35
    for scene, box in zoomed:  # each cut holds at least one whole object, labelled
        cats, _ = train.patch_labels(scene, box=box)
        assert (cats > 0).any()
        x0, y0, x1, y1 = box
        assert 0 <= x0 < x1 <= scene.resolution and 0 <= y0 < y1 <= scene.resolution


def test_a_stage1_cache_from_another_recipe_is_refused(tmp_path, monkeypatch):
    for knob in ("ZOOM", "CONTEXT_BREAKING"):  # main() sets them; restore them afterwards
        monkeypatch.setattr(tasks, knob, getattr(tasks, knob))
    from transformers import LlavaForConditionalGeneration

    from evaluators.organism.package import build_model_config, build_tokenizer

    tok = build_tokenizer(tasks.vocabulary())
    model = LlavaForConditionalGeneration(build_model_config(len(tok), image_size=train.IMAGE_SIZE, patch_size=train.PATCH))
    cache = tmp_path / "vision.pt"
    torch.save({"vision_tower": model.model.vision_tower.state_dict(), "seconds": 1,
                "recipe": {"vision_steps": 1500, "seed": 0, "zoom": 0.0}}, cache)
    with pytest.raises(ValueError, match="vision-cache.*zoom"):
        train.main(["--vision-cache", str(cache), "--zoom", "0.2", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
