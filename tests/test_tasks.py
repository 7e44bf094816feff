"""The organism's training tasks: truthful answers, a closed vocabulary, deterministic."""

import re

import numpy as np
import pytest

from evaluators.answers import parse_box
from evaluators.organism import tasks
from evaluators.organism.package import build_tokenizer
from evaluators.world import BIASED, World


@pytest.fixture(scope="module")
def world():
    return World(BIASED)


@pytest.mark.parametrize("task", sorted(tasks.GENERATORS))
def test_every_task_stays_in_the_vocabulary(world, task):
    tokenizer = build_tokenizer(tasks.vocabulary())
    for seed in range(15):
        ex = tasks.sample(world, seed, task)
        ids = tokenizer(f"{ex.question} {ex.answer}", add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, (task, ex.question, ex.answer)
        assert ex.images and all(img.size == (128, 128) for img in ex.images)


def test_samples_are_deterministic(world):
    a, b = tasks.sample(world, 42), tasks.sample(world, 42)
    assert (a.task, a.question, a.answer) == (b.task, b.question, b.answer)
    assert np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))


def test_answers_are_the_ground_truth(world):
    for seed in range(40):
        ex = tasks.sample(world, seed, "existence")
        scene = world.scene(seed)
        assert (ex.answer == "yes") == scene.present(ex.meta["category"])
        ex = tasks.sample(world, seed, "counting")
        assert ex.answer == tasks.NUMBERS[ex.meta["count"]]


def test_beliefs_are_right_most_but_not_all_of_the_time(world):
    right = [tasks.sample(world, s, "prior_existence").meta["belief_right"] for s in range(300)]
    assert 0.6 < np.mean(right) < 0.95


def test_do_bench_templates_match_the_paper(world):
    # DO-Bench Sec. 3.2: levels differ by one certainty token
    assert tasks.do_prior(1, "dog", True) == "i suspect there is no dog in the image ."
    assert tasks.do_prior(3, "dog", True) == "i am certain there is no dog in the image ."
    assert tasks.do_prior(0, "dog", True) == ""
    with pytest.raises(ValueError, match="level"):
        tasks.do_prior(4, "dog", True)
    with pytest.raises(ValueError, match="task"):
        tasks.sample(world, 1, "poetry")


def test_box_tokens_round_trip():
    box = (16.0, 32.0, 48.0, 64.0)
    text = tasks.box_tokens(box, 128)
    assert re.fullmatch(r"(<c\d+> ){3}<c\d+>", text)
    assert parse_box(text, 128) == box


def test_context_breaking_existence_questions_defeat_the_context_shortcut(monkeypatch):
    """With CONTEXT_BREAKING = 1 every existence question whose scene allows it asks about a
    typical-but-absent or an atypical-but-present category; with 0 the scene's context alone
    answers most of them."""
    import numpy as np

    from evaluators.organism import tasks
    from evaluators.world import BIASED, CONTEXT_CATEGORIES, World

    world = World(BIASED)

    def context_right(share: float) -> float:
        monkeypatch.setattr(tasks, "CONTEXT_BREAKING", share)
        rng, right = np.random.default_rng(0), 0
        for i in range(300):
            ex = tasks.existence(world, rng, 20_000 + i)
            typical = ex.meta["category"] in CONTEXT_CATEGORIES[world.scene(20_000 + i).context]
            assert (ex.answer == "yes") == world.scene(20_000 + i).present(ex.meta["category"])
            right += (ex.answer == "yes") == typical
        return right / 300

    assert context_right(0.0) > 0.75
    # scenes rarely hold an atypical object, so many positives cannot break the context:
    # at share 1 the context is still no better than a coin
    assert context_right(1.0) < 0.5


def test_zoomed_views_ask_only_what_the_view_shows(monkeypatch, world):
    """With ZOOM = 1 every existence/colour image is a cut of the scene around one object
    (DO-Bench's Crop rule), and its answer is exact for the pixels of the cut: "yes" only
    for a category with an instance wholly in it, "no" only for one with no pixel in it
    (seed 1043 has a bird whose box misses the crop box but whose pixels reach the cut's
    rounded-out border); a colour question names the one instance of its category in view."""
    from evaluators.world import MARGINS

    monkeypatch.setattr(tasks, "ZOOM", 1.0)

    def visible(scene, box, category):
        """(pixels in the cut, pixels in all) per instance of ``category``."""
        x0, y0, x1, y1 = box
        return [(int(scene.masks()[o.uid][y0:y1, x0:x1].sum()), int(scene.masks()[o.uid].sum()))
                for o in scene.objects if o.category == category]

    answers = set()
    for seed in [*range(60), 1043, 2691]:
        scene = world.scene(seed)
        ex = tasks.sample(world, seed, "existence")
        box = ex.meta["view_box"]
        assert ex.meta["zoomed"] and all(isinstance(v, int) for v in box)
        assert np.array_equal(np.asarray(ex.images[0]), np.asarray(scene.render())[box[1]:box[3], box[0]:box[2]])
        shown = visible(scene, box, ex.meta["category"])
        if ex.answer == "yes":
            assert any(inside == total > 0 for inside, total in shown)
        else:
            assert all(inside == 0 for inside, _ in shown)
        answers.add(ex.answer)
        col = tasks.sample(world, seed, "colour")
        cbox = col.meta["view_box"]
        shown = [o for o in scene.objects if o.category == col.meta["category"]
                 and scene.masks()[o.uid][cbox[1]:cbox[3], cbox[0]:cbox[2]].any()]
        assert len(shown) == 1 and col.answer == shown[0].colour
    assert answers == {"yes", "no"}
    assert tasks.ZOOM_MARGINS[:2] == MARGINS
    monkeypatch.setattr(tasks, "ZOOM", -0.1)
    with pytest.raises(ValueError, match="ZOOM"):
        tasks.sample(world, 0, "existence")


def test_zoom_zero_keeps_full_scenes(world):
    assert tasks.ZOOM == 0.0
    for seed in range(10):
        ex = tasks.sample(world, seed, "existence")
        assert not ex.meta["zoomed"] and ex.meta["view_box"] is None
        assert ex.images[0].size == (128, 128)
