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


def test_patch_boxes_are_the_grounding_answer_on_the_whole_scene():
    """Every object patch carries the box bins tasks.grounding answers with for its object."""
    world = World(BIASED)
    for seed in range(30):
        scene = world.scene(seed)
        owners, boxes = train.patch_owners(scene), train.patch_boxes(scene)
        cats, _ = train.patch_labels(scene)
        assert ((owners >= 0) == (cats > 0)).all() and (boxes[owners < 0] == -1).all()
        for patch in np.nonzero(owners >= 0)[0]:
            obj = scene.objects[owners[patch]]
            answer = tasks.box_tokens(scene.boxes()[obj.uid], scene.resolution)
            assert " ".join(f"<c{b}>" for b in boxes[patch]) == answer


def test_patch_boxes_of_a_zoomed_view_are_in_the_cut():
    scene = _one_cup()  # source pixels 32..63
    # the cut 16..80 is 64 px: the cup spans 16..47 of it, bins 4..11 of 16
    boxes = train.patch_boxes(scene, box=(16, 16, 80, 80)).reshape(8, 8, 4)
    assert (boxes[2:6, 2:6] == [4, 4, 11, 11]).all()
    assert (boxes[:2] == -1).all() and (boxes[6:] == -1).all()
    # a cut that shows only the cup's left half: its visible part fills the cut's right half
    boxes = train.patch_boxes(scene, box=(16, 32, 48, 64)).reshape(8, 8, 4)
    assert (boxes[:, 4:] == [8, 0, 15, 15]).all() and (boxes[:, :4] == -1).all()


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


def test_patch_views_take_a_zoom_share_of_their_own(monkeypatch):
    """Stage 2's --align-zoom: an explicit share overrides tasks.ZOOM either way, None
    follows it, and a share outside [0, 1] is refused."""
    world = World(BIASED)
    scenes = [world.scene(i) for i in range(40)]
    boxes = lambda views: [box for _, box in views]  # noqa: E731
    assert all(b is None for b in boxes(train.patch_views(scenes, np.random.default_rng(0), 0.0)))
    zoomed = boxes(train.patch_views(scenes, np.random.default_rng(0), 0.5))
    assert 5 <= sum(b is not None for b in zoomed) <= 35
    monkeypatch.setattr(tasks, "ZOOM", 0.5)
    assert boxes(train.patch_views(scenes, np.random.default_rng(0))) == zoomed
    assert all(b is None for b in boxes(train.patch_views(scenes, np.random.default_rng(0), 0.0)))
    with pytest.raises(ValueError, match="zoom"):
        train.patch_views(scenes, np.random.default_rng(0), 1.5)


def _v10_cache(tmp_path, monkeypatch):
    """A stage-1 cache as organism v10's recipe writes it (main() sets the task knobs:
    they are restored afterwards)."""
    for knob in ("ZOOM", "CONTEXT_BREAKING"):
        monkeypatch.setattr(tasks, knob, getattr(tasks, knob))
    from transformers import LlavaForConditionalGeneration

    from evaluators.organism.package import build_model_config, build_tokenizer

    tok = build_tokenizer(tasks.vocabulary())
    model = LlavaForConditionalGeneration(build_model_config(len(tok), image_size=train.IMAGE_SIZE, patch_size=train.PATCH))
    cache = tmp_path / "vision.pt"
    torch.save({"vision_tower": model.model.vision_tower.state_dict(), "seconds": 1,
                "recipe": {"vision_steps": 1500, "seed": 0, "zoom": 0.0}}, cache)
    return cache


@pytest.mark.parametrize("flag, value, bad, recorded", [
    ("--zoom", "0.2", "1.5", "zoom"),
    ("--vision-position-weight", "1", "-1", "position_weight"),
    ("--vision-world", "unbiased", "photos", "world"),
    ("--vision-box-weight", "1", "-1", "box_weight"),
])
def test_a_stage1_cache_from_another_recipe_is_refused(tmp_path, monkeypatch, flag, value, bad, recorded):
    """v10's cache is refused for a run whose stage 1 differs (the recipe key named), and a
    bad value of the flag is a usage error; nothing is written either way."""
    cache = _v10_cache(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=f"vision-cache.*{recorded}"):
        train.main(["--vision-cache", str(cache), flag, value, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        train.main([flag, bad, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_stage1_cache_of_older_world_data_is_refused(tmp_path, monkeypatch):
    """The same flags on other data (the world's seeds gave other scenes before
    DATA_VERSION 2) are another recipe: the cache is refused, naming the data version."""
    cache = _v10_cache(tmp_path, monkeypatch)
    args = ["--vision-cache", str(cache), "--vision-steps", "1500", "--zoom", "0.0", "--vision-world", "biased"]
    with pytest.raises(ValueError, match="vision-cache.*world_data"):
        train.main([*args, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def _after_one_step(stage, part: str, runs: list[dict]):
    """Per keyword set in ``runs``: the state of ``model.model.<part>`` after one step of
    ``stage`` (train.pretrain_vision or train.align_projector) from the same seeded
    organism; also the last model and processor, for a refused call."""
    from transformers import LlavaForConditionalGeneration

    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer
    from evaluators.world import BIASED, World

    tok = build_tokenizer(tasks.vocabulary())
    processor = build_processor(tok, image_size=train.IMAGE_SIZE, patch_size=train.PATCH)
    states = []
    for kwargs in runs:
        torch.manual_seed(0)
        model = LlavaForConditionalGeneration(
            build_model_config(len(tok), image_size=train.IMAGE_SIZE, patch_size=train.PATCH))
        stage(model, processor, World(BIASED), 1, 4, 0, lambda m: None, **kwargs)
        states.append(getattr(model.model, part).state_dict())
    return states, model, processor


@pytest.mark.parametrize("stage, part, name, value", [
    (train.pretrain_vision, "vision_tower", "position_weight", 1.0),  # the grid cell as a label
    (train.pretrain_vision, "vision_tower", "box_weight", 1.0),  # the object's box bins as labels
    (train.align_projector, "multi_modal_projector", "position_scale", 0.5),  # a position code in the targets
    (train.align_projector, "multi_modal_projector", "box_scale", 0.5),  # the object's box code in the targets
])
def test_a_recipe_option_at_zero_is_the_recipe_without_it(stage, part, name, value):
    """One step from the same start: 0 gives the weights of the call without the argument
    (the earlier recipes), a positive value trains differently, a negative one is refused
    naming the argument."""
    from evaluators.world import BIASED, World

    states, model, processor = _after_one_step(stage, part, [{}, {name: 0.0}, {name: value}])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0])
    with pytest.raises(ValueError, match=name):
        stage(model, processor, World(BIASED), 1, 4, 0, lambda m: None, **{name: -1.0})


def test_position_codes_name_every_grid_cell_apart():
    codes = train.position_codes(32, 2.0, seed=0)
    assert codes.shape == (train.GRID * train.GRID, 32)
    # u[column] + v[row]: the column's and the row's parts are recoverable by differences
    cells = torch.arange(train.GRID * train.GRID)
    u = codes[cells // train.GRID == 0]  # row 0: u[column] + v[0]
    assert (u - u[0]).norm(dim=1)[1:].min() > 0
    assert torch.equal(codes, train.position_codes(32, 2.0, seed=0))
    assert not torch.equal(codes, train.position_codes(32, 2.0, seed=1))
    # additive: one column to the right is the same shift in every row
    assert torch.allclose(codes[1] - codes[0], codes[train.GRID + 1] - codes[train.GRID])
    assert torch.count_nonzero(train.position_codes(32, 0.0, seed=0)) == 0


def test_box_codes_are_seeded_directions_of_the_given_norm():
    codes = train.box_codes(32, 2.0, seed=0)
    assert codes.shape == (4, tasks.COORD_BINS, 32)
    assert torch.allclose(codes.norm(dim=-1), torch.full((4, tasks.COORD_BINS), 2.0))
    assert torch.equal(codes, train.box_codes(32, 2.0, seed=0))
    assert not torch.equal(codes, train.box_codes(32, 2.0, seed=1))
    # every (edge, bin) has its own direction: no two codes nearly parallel
    flat = torch.nn.functional.normalize(codes.reshape(-1, 32), dim=-1)
    assert (flat @ flat.T - torch.eye(len(flat))).abs().max() < 0.9


def test_the_unbiased_vision_world_has_no_dominant_colours():
    assert train.VISION_WORLDS["biased"] is BIASED and not train.VISION_WORLDS["unbiased"].dominant_colour


@pytest.mark.parametrize("projector_lr", [0.0, 1e-3])
def test_stage3_trains_the_projector_only_when_asked(projector_lr):
    """One instruction step: the decoder always moves; the projector only with projector_lr
    > 0; the vision tower and the word embeddings never (the projector was aligned to them)."""
    from transformers import LlavaForConditionalGeneration

    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer

    tok = build_tokenizer(tasks.vocabulary())
    processor = build_processor(tok, image_size=train.IMAGE_SIZE, patch_size=train.PATCH)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(build_model_config(len(tok), image_size=train.IMAGE_SIZE, patch_size=train.PATCH))
    parts = {"tower": model.model.vision_tower, "projector": model.model.multi_modal_projector,
             "embeddings": model.get_input_embeddings(), "decoder": model.model.language_model.layers}
    before = {name: [p.detach().clone() for p in part.parameters()] for name, part in parts.items()}
    train.instruct(model, processor, World(BIASED), float("inf"), 2, 0, lambda m: None, 1, projector_lr=projector_lr)
    moved = {name: any(not torch.equal(a, b) for a, b in zip(before[name], part.parameters()))
             for name, part in parts.items()}
    assert moved == {"tower": False, "projector": projector_lr > 0, "embeddings": False, "decoder": True}


def test_unbiased_existence_share_draws_only_plain_existence_scenes_from_the_unbiased_world(tmp_path):
    """Share 0 is the old recipe (no draw at all); share 1 sends every plain existence
    example to the unbiased world and no other task; a share in between is seeded per
    example, so a rerun draws the same scenes."""
    biased, unbiased = World(BIASED), World(train.VISION_WORLDS["unbiased"])
    pick = train._existence_world
    assert all(pick(biased, unbiased, 0.0, 0, s, i, "existence") is biased for s in range(5) for i in range(8))
    assert all(pick(biased, unbiased, 1.0, 0, s, i, "existence") is unbiased for s in range(5) for i in range(8))
    for task in set(tasks.MIX) - {"existence"}:
        assert pick(biased, unbiased, 1.0, 0, 3, 1, task) is biased
    draws = [pick(biased, unbiased, 0.5, 0, s, i, "existence") is unbiased for s in range(50) for i in range(32)]
    assert 0.45 < np.mean(draws) < 0.55
    assert draws == [pick(biased, unbiased, 0.5, 0, s, i, "existence") is unbiased for s in range(50) for i in range(32)]
    kept = train.unbiased_existence_config(keep_cooccurrence=True)
    assert train.unbiased_existence_config() is train.VISION_WORLDS["unbiased"]
    assert kept.cooccurrence == BIASED.cooccurrence and kept.replace(cooccurrence=()) == train.VISION_WORLDS["unbiased"]
    with pytest.raises(ValueError, match="unbiased_existence"):
        train.instruct(None, None, biased, float("inf"), 2, 0, lambda m: None, 1, unbiased_existence=1.5)
    with pytest.raises(SystemExit):
        train.main(["--unbiased-existence", "-0.1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # the pairs of a share that is not drawn
        train.main(["--keep-cooccurrence", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        train.main(["--language-short-share", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        train.main(["--align-zoom", "1.5", "--out", str(tmp_path)])


def test_the_model_card_names_the_unbiased_existence_share():
    from evaluators.organism.signatures import CARD_ROWS, card

    training = {"instruct_steps": 3000, "unbiased_existence": 0.5, "seconds": {}}
    result = {"checks": {}, **{key: 0.0 for _, key, _ in CARD_ROWS}}
    text = card(result, training, 100)
    assert "--unbiased-existence 0.5" in text and "50% of plain existence questions on unbiased scenes" in text
    assert "unbiased-existence" not in card(result, {**training, "unbiased_existence": 0.0}, 100)
    kept = card(result, {**training, "keep_cooccurrence": True}, 100)
    assert "--keep-cooccurrence" in kept and "co-occurrence pairs kept" in kept
    assert "--language-short-share 0.4" in card(result, {**training, "language_short_share": 0.4}, 100)
    assert "language-short-share" not in card(result, {**training, "language_short_share": 0.7}, 100)
    zoomed = card(result, {**training, "align_zoom": 0.5}, 100)
    assert "--align-zoom 0.5" in zoomed and "50% of its images zoomed views" in zoomed
    assert "--align-zoom 0.0" in card(result, {**training, "align_zoom": 0.0}, 100)  # 0 is not --zoom's share
    assert "align-zoom" not in card(result, training, 100)
    boxed = card(result, {**training, "vision_box_weight": 1.0, "align_box_scale": 0.5}, 100)
    assert "--vision-box-weight 1.0 --align-box-scale 0.5" in boxed
    assert "category/colour/object's box labels" in boxed and "the object's box code on its patches" in boxed
    assert "box" not in card(result, training, 100).split("## Training")[1].split("## Hallucination")[0]


TINY = ["--vision-steps", "1", "--align-steps", "2", "--align-joint-steps", "1", "--language-steps", "2",
        "--max-steps", "2", "--warmup-steps", "1", "--batch", "2", "--threads", "1"]


def test_stage3_from_a_stage2_cache_equals_the_run_that_wrote_it(tmp_path, monkeypatch):
    """A tiny run writes the cache of stages 1-2b; a second run with the same recipe loads
    it and ends with the same weights (stage 3 draws no torch random numbers), and says so
    on its card; a run whose stages 1-2b differ is refused, naming the key."""
    from safetensors.torch import load_file

    for knob in ("ZOOM", "CONTEXT_BREAKING"):
        monkeypatch.setattr(tasks, knob, getattr(tasks, knob))
    cache = tmp_path / "stage2.pt"
    train.main([*TINY, "--stage2-cache", str(cache), "--out", str(tmp_path / "a")])
    assert cache.exists()
    train.main([*TINY, "--stage2-cache", str(cache), "--out", str(tmp_path / "b")])
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert "--stage2-cache" in (tmp_path / "b" / "training.json").read_text()
    with pytest.raises(ValueError, match="stage2-cache.*language_steps"):
        train.main([*TINY, "--language-steps", "3", "--stage2-cache", str(cache), "--out", str(tmp_path / "c")])
    with pytest.raises(ValueError, match="stage2-cache.*align_zoom"):
        train.main([*TINY, "--align-zoom", "0.5", "--stage2-cache", str(cache), "--out", str(tmp_path / "c")])
    with pytest.raises(ValueError, match="stage2-cache.*language_short_share"):
        train.main([*TINY, "--language-short-share", "0.4", "--stage2-cache", str(cache), "--out", str(tmp_path / "c")])
    assert not (tmp_path / "c").exists()


def test_image_labels_and_segment_stage_reach_training_the_saved_template_and_the_card(tmp_path, monkeypatch):
    """``--image-labels --segment-steps``: stage 3's multi-image prompts are labelled (as
    the saved chat template renders them), stage 2c runs and is timed, and the card says so;
    without the flags the saved template is the plain one."""
    import json

    from transformers import AutoProcessor

    from evaluators.organism import CHAT_TEMPLATE, LABELLED_CHAT_TEMPLATE
    from evaluators.organism.signatures import CARD_ROWS, card

    for knob in ("ZOOM", "CONTEXT_BREAKING"):
        monkeypatch.setattr(tasks, knob, getattr(tasks, knob))
    texts = []
    make_batch = train.make_batch
    monkeypatch.setattr(train, "make_batch", lambda processor, examples, image_labels=False: (
        texts.extend(f"{ex.task}|{len(ex.images)}|{image_labels}" for ex in examples),
        make_batch(processor, examples, image_labels))[1])
    monkeypatch.setattr(train, "task_schedule", lambda rng, mix=None: "which_image")
    train.main([*TINY, "--image-labels", "--segment-steps", "3", "--out", str(tmp_path / "a")])
    assert texts and all(t.startswith("which_image|") and t.endswith("|True") for t in texts)
    saved = AutoProcessor.from_pretrained(tmp_path / "a")
    assert saved.chat_template == saved.tokenizer.chat_template == LABELLED_CHAT_TEMPLATE
    training = json.loads((tmp_path / "a" / "training.json").read_text())
    assert training["image_labels"] and training["segment_steps"] == 3 and "segment" in training["seconds"]
    result = {"checks": {}, **{key: 0.0 for _, key, _ in CARD_ROWS}}
    text = card(result, training, 100)
    assert "--image-labels --segment-steps 3" in text and "'image N' label" in text
    train.main([*TINY, "--out", str(tmp_path / "b")])
    assert AutoProcessor.from_pretrained(tmp_path / "b").chat_template == CHAT_TEMPLATE
    plain = json.loads((tmp_path / "b" / "training.json").read_text())
    assert not plain["image_labels"] and plain["segment_steps"] == 0 and "segment" not in plain["seconds"]
    assert "segment" not in card(result, plain, 100)
    with pytest.raises(SystemExit):
        train.main([*TINY, "--segment-steps", "-1", "--out", str(tmp_path / "c")])


def test_the_recipe_command_needs_an_output_folder(capsys):
    """Its defaults are not the shipped organism's recipe, and the default folder was the
    shipped checkpoint: a bare command would have overwritten it."""
    with pytest.raises(SystemExit):
        train.main([])
    assert "--out" in capsys.readouterr().err
