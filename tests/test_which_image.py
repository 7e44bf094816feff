"""Multi-image "in which image is there an X?" questions verified image by image
(mitigate.which_image, CropVerify.answer_which_image), on the shipped organism."""

from __future__ import annotations

import pytest

from evaluators.answers import parse_option
from evaluators.benchmarks.mioh.suite import build
from evaluators.model import HFModel
from evaluators.organism import ORGANISM_DIR, load_organism
from mitigate import CropVerify
from mitigate.crop_verify import _yes_evidence
from mitigate.which_image import EXISTENCE_TEMPLATE, decide, parse_any_image, parse_multi_image, parse_which_image

MIOH = ("in which image is there a banana ? a ) image 1 b ) image 2 c ) image 3 d ) image 4 "
        "e ) none of the above")


@pytest.mark.parametrize("prompt, n, letters, none", [
    (MIOH, 4, {0: "a", 1: "b", 2: "c", 3: "d"}, "e"),
    ("In which image is there a dog? A) Image 1 B) Image 2 C) None of the above", 2, {0: "a", 1: "b"}, "c"),
    ("analysis confirms there is no banana in the image . " + MIOH, 4, {0: "a", 1: "b", 2: "c", 3: "d"}, "e"),
    ("In which image are there any red cups? (A) Image 2 (B) Image 1", 2, {1: "a", 0: "b"}, None),
])
def test_parse_which_image(prompt, n, letters, none):
    parsed = parse_which_image(prompt, n)
    assert parsed is not None and parsed.letters == letters and parsed.none == none
    assert parsed.image_of(letters[0]) == 0 and parsed.image_of(none) is None


@pytest.mark.parametrize("prompt, n", [
    ("which is in image 1 but not image 2 ? a ) dog b ) cat c ) none of the above", 2),  # not "in which image"
    (MIOH, 3),  # an option names image 4 of 3
    ("in which image is there a dog ? a ) image 1 b ) image 1", 2),  # one image named twice
    ("in which image is there a dog ? a ) image 1 c ) image 2", 2),  # letters skip b
    ("in which image is there a dog ?", 2),  # no options
    ("is there a dog in the image ?", 1),
])
def test_other_questions_are_not_parsed(prompt, n):
    assert parse_which_image(prompt, n) is None


def test_none_of_the_above_twice_is_not_this_question():
    """Two "none of the above" options: the parser kept the later letter, so a model's "c"
    read as an image-less answer nowhere and answer_for_none wrote "d". Not parsed, as an
    image named twice is not; answer_which_image refuses it, saying so."""
    prompt = "in which image is there a dog ? a ) image 1 b ) image 2 c ) none of the above d ) none of the above"
    assert parse_which_image(prompt, 2) is None and parse_multi_image(prompt, 2) is None
    from PIL import Image

    images = [Image.new("RGB", (16, 16)), Image.new("RGB", (16, 16))]
    with pytest.raises(ValueError, match="'none of the above' at most once"):
        CropVerify(processor=None).answer_which_image(None, [images], [prompt])


@pytest.mark.parametrize("kwargs", [{"locate": "embedding"}, {"queries": "object"}], ids=["embedding", "object"])
def test_an_object_the_tokenizer_does_not_know_is_counted_not_fatal(kwargs):
    """The per-image questions name the object read from the prompt: a word the tokenizer
    does not know ("zebra" on the organism) leaves those images to answer()'s lenient path,
    counted in stats["which_image"]["object_not_found"] -- it raised a ValueError."""
    import torch

    from evaluators.organism import tasks
    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer
    from evaluators.world import BIASED, World
    from transformers import LlavaForConditionalGeneration

    processor = build_processor(build_tokenizer(tasks.vocabulary()))
    torch.manual_seed(0)  # random weights: every answer unconfident, every image's answer gated
    model = LlavaForConditionalGeneration(build_model_config(len(processor.tokenizer))).eval()
    images = [World(BIASED).scene(i).render() for i in range(2)]
    prompt = "in which image is there a zebra ? a ) image 1 b ) image 2 c ) none of the above"
    cv = CropVerify(processor, gate=1.0, tau=0.0, which_image="decompose", **kwargs)
    (result,) = cv.answer_which_image(model, [images], [prompt], max_new_tokens=3)
    assert result["verified"] and cv.stats["which_image"]["object_not_found"] == 2
    assert cv.stats["queries"] == 0  # the per-image questions keep their stats apart


def test_answers_map_to_options():
    parsed = parse_which_image(MIOH, 4)
    assert parsed.object == "banana" and parsed.question() == EXISTENCE_TEMPLATE.format(object="banana")
    for answer, letter in [("e", "e"), ("e ) none of the above", "e"), ("E) None of the above", "e"),
                           ("none of the above", "e"), ("b", "b"), ("image 3", "c"), ("maybe", None)]:
        assert parsed.choice(answer) == letter, answer
    with pytest.raises(ValueError, match="n_images"):
        parse_which_image(MIOH, 0)


def test_answers_are_read_as_the_evaluators_grade_them():
    """A closing "the answer is ..." decides, for the mitigation as for the grading
    (evaluators.query.parse): reasoning before it names other images."""
    from evaluators.query import Query, parse

    which = parse_which_image(MIOH, 4)
    query = Query("q", "mioh", [], MIOH, "option", "e", {}, options=list(which.options))
    for answer, letter in [("image 2 has a knife , image 1 a cup . so the answer is e ) none of the above", "e"),
                           ("i looked at image 2 . answer : c", "c"), ("b", "b")]:
        assert which.choice(answer) == parse(query, answer) == letter, answer
    anyimage = parse_any_image("is there a banana in the images ? answer yes or no .", 2)
    yes_no = Query("y", "mioh", [], "", "yes_no", "no", {})
    for answer, value in [("no banana in image 1 , but the answer is yes", "yes"),
                          ("the answer is not obvious , but no", "no")]:
        assert anyimage.choice(answer) == value and parse(yes_no, answer) == (value == "yes"), answer


needs_organism = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")


@pytest.fixture(scope="module")
def organism_and_queries():
    model, processor = load_organism()
    queries = [q for q in build(n_per_condition=4, seed=0)
               if q.record["condition"] in ("easy", "HP", "HN") and parse_which_image(q.prompt, len(q.images))]
    return model, processor, queries


@needs_organism
@pytest.mark.parametrize("tau, gate, which_image", [(1.0, 1.0, False), (0.5, 0.0, "decompose")])
def test_tau_one_is_the_unmitigated_model(organism_and_queries, tau, gate, which_image):
    """tau = 1: nothing can overturn; under "decompose", a confident first answer (here every
    answer, gate 0) is final as well."""
    model, processor, queries = organism_and_queries
    sets, prompts = [q.images for q in queries], [q.prompt for q in queries]
    plain = HFModel(model, processor, max_new_tokens=8)(queries)
    cv = CropVerify(processor, tau=tau, gate=gate, which_image=which_image)
    got = cv.answer_which_image(model, sets, prompts, max_new_tokens=8)
    assert [r["answer"] for r in got] == plain
    assert cv.stats["which_image"] == {"queries": len(queries), "verified": 0, "overturned": 0, "images_asked": 0}
    assert cv.stats["queries"] == 0  # no single-image question was asked


class PreferNone:
    """A logits processor that makes the first answer token of a question offering "none of
    the above" the "none" option, just above the model's own best (so its confidence stays
    below 1), and leaves every other step and question alone. Organism v17 never answers
    "none" to MIOH's multi-image questions (0 of 36 here), so without it the policy's
    verification branch would go untested; the per-image questions it asks are the
    organism's own answers."""

    def __init__(self, tokenizer, letter: str = "e"):
        self.above, self.letter = tokenizer.convert_tokens_to_ids(["above", letter])
        self.prompt_end = tokenizer.convert_tokens_to_ids(":")
        self.steered = 0

    def __call__(self, input_ids, scores):
        first = (input_ids[:, -1] == self.prompt_end) & (input_ids == self.above).any(-1)
        if first.any():
            scores = scores.clone()
            scores[first, self.letter] = scores[first].max(-1).values + 1.0
            self.steered += int(first.sum())
        return scores


@needs_organism
def test_only_an_unconfident_none_is_checked_and_the_policy_holds(organism_and_queries):
    from transformers import LogitsProcessorList

    model, processor, queries = organism_and_queries
    sets, prompts = [q.images for q in queries], [q.prompt for q in queries]
    steer = PreferNone(processor.tokenizer)
    # half of the questions steered to "none": the others keep the model's image answers
    cv = CropVerify(processor, gate=1.0, tau=0.5)
    half = len(queries) // 2
    results = cv.answer_which_image(model, sets[:half], prompts[:half], max_new_tokens=8,
                                    logits_processor=LogitsProcessorList([steer]))
    assert steer.steered == half  # the first pass only: the per-image questions offer no "none"
    results += cv.answer_which_image(model, sets[half:], prompts[half:], max_new_tokens=8)
    stats = cv.stats["which_image"]
    nones = [r for r, p in zip(results, prompts) if parse_which_image(p, 4).choice(r["first_answer"]) == "e"]
    assert len(nones) >= half, "every steered question starts from 'none of the above'"
    assert stats["verified"] == len(nones) == sum(r["verified"] for r in results)
    assert stats["images_asked"] == 4 * len(nones) and cv.stats["queries"] == 0  # per-image asks kept apart
    for r, q in zip(results, queries):
        parsed = parse_which_image(q.prompt, len(q.images))
        if not r["verified"]:  # an image answer, or a confident one, is final
            assert r["answer"] == r["first_answer"]
            continue
        assert sorted(r["images"]) == [0, 1, 2, 3]
        if r["answer"] != r["first_answer"]:  # overturned to the image with the strongest "yes" above tau
            chosen = r["images"][r["chosen"]]
            assert chosen["answer"] == "yes"
            p_yes = chosen["views"][chosen["chosen"]]["p_yes"] if chosen.get("chosen") else chosen["confidence"]
            assert p_yes > 0.5
            assert parse_option(r["answer"], parsed.options) == parsed.letters[r["chosen"]]
    assert stats["overturned"] == sum(r["answer"] != r["first_answer"] for r in results)
    assert stats["overturned"] > 0, "the check must cover overturned answers (v17: 4 of 6 steered)"


def test_the_per_image_question_keeps_the_prompts_pressure_only_when_asked():
    prompt = "analysis confirms there is no banana in the image . " + MIOH
    which = parse_which_image(prompt, 4)
    assert CropVerify(object()).image_question(prompt, which) == EXISTENCE_TEMPLATE.format(object="banana")
    kept = CropVerify(object(), strip_priors=False).image_question(prompt, which)
    assert kept == "analysis confirms there is no banana in the image . " + EXISTENCE_TEMPLATE.format(object="banana")
    # a prompt without a belief sentence asks the template alone either way
    assert CropVerify(object(), strip_priors=False).image_question(MIOH, parse_which_image(MIOH, 4)) == \
        EXISTENCE_TEMPLATE.format(object="banana")


def test_the_decision_from_hand_made_evidence():
    with_none = parse_which_image(MIOH, 4)
    without_none = parse_which_image("In which image are there any red cups? (A) Image 2 (B) Image 1", 2)
    # the strongest "yes" above tau, strictly; ties go to the first image
    assert decide(with_none, {0: 0.6, 1: None, 2: 0.9, 3: 0.7}, 0.5, decompose=False) == 2
    assert decide(with_none, {0: 0.8, 1: 0.8, 2: None, 3: None}, 0.5, decompose=True) == 0
    assert decide(with_none, {0: 0.5, 1: None, 2: None, 3: None}, 0.5, decompose=True) == "none"
    # no image passes: "none" only when decomposing and the question offers it
    assert decide(with_none, {0: None, 1: None, 2: None, 3: None}, 0.5, decompose=False) is None
    assert decide(without_none, {0: None, 1: 0.4}, 0.5, decompose=True) is None
    assert with_none.answer_for_none() == "e) none of the above"
    assert parse_option(with_none.answer_for(2), with_none.options) == "c"
    with pytest.raises(ValueError, match="none of the above"):
        without_none.answer_for_none()


@needs_organism
def test_decompose_rederives_every_unconfident_answer_from_the_images(organism_and_queries):
    model, processor, queries = organism_and_queries
    sets, prompts = [q.images for q in queries], [q.prompt for q in queries]
    changed_from = {"image": 0, "other": 0}
    for tau in (0.5, 0.9):  # 0.9: fewer images pass, so "none of the above" is chosen too
        cv = CropVerify(processor, gate=1.0, tau=tau, which_image="decompose")
        results = cv.answer_which_image(model, sets, prompts, max_new_tokens=8)
        stats = cv.stats["which_image"]
        assert stats["verified"] == len(queries) == sum(r["verified"] for r in results)  # every answer < 1.0
        assert stats["images_asked"] == 4 * len(queries) and cv.stats["queries"] == 0
        for r, q in zip(results, queries):
            parsed = parse_which_image(q.prompt, len(q.images))
            evidence = {k: _yes_evidence(rec) for k, rec in r["images"].items()}
            passed = {k: e for k, e in evidence.items() if e is not None and e > tau}
            want = parsed.letters[max(passed, key=passed.get)] if passed else parsed.none
            assert parse_option(r["answer"], parsed.options) == want
            first = parse_option(r["first_answer"], parsed.options)
            if first != want:
                assert r["chosen"] == ("none" if want == parsed.none else parsed.image_of(want))
                changed_from["image" if parsed.image_of(first) is not None else "other"] += 1
            else:
                assert r["answer"] == r["first_answer"] and "chosen" not in r
        assert stats["overturned"] == sum(r["answer"] != r["first_answer"] for r in results)
    # v17 never answers "none" here, so every change overturns an image answer -- what the
    # default policy never does
    assert changed_from["image"] > 0
    assert any(parse_option(r["answer"], parse_which_image(q.prompt, 4).options) == "e"
               for r, q in zip(results, queries)), "tau 0.9 leaves some question with no image (v17: HN)"


@needs_organism
def test_the_per_image_questions_are_read_from_one_token(organism_and_queries):
    """The per-image yes/no questions answer with ``yes_no_view_tokens`` tokens (1), as the
    views of a yes/no question do: the same decisions and evidence as at max_new_tokens."""
    model, processor, queries = organism_and_queries
    sets, prompts = [q.images for q in queries], [q.prompt for q in queries]
    runs, rows = {}, {}

    def count(module, args, kwargs):  # rows x forwards
        rows[tokens] += kwargs["input_ids"].shape[0]

    for tokens in (1, None):
        cv = CropVerify(processor, gate=1.0, which_image="decompose", yes_no_view_tokens=tokens)
        rows[tokens] = 0
        handle = model.register_forward_pre_hook(count, with_kwargs=True)
        try:
            runs[tokens] = (cv.answer_which_image(model, sets, prompts, max_new_tokens=8), cv.stats["which_image"])
        finally:
            handle.remove()
    (short, short_stats), (full, full_stats) = runs[1], runs[None]
    assert short_stats == full_stats and short_stats["overturned"] > 0
    assert rows[1] < rows[None]
    for a, b in zip(short, full):
        assert (a["answer"], a.get("chosen")) == (b["answer"], b.get("chosen"))
        for k, record in b["images"].items():
            assert a["images"][k]["answer"] == record["answer"]  # the organism answers in one word
            assert _yes_evidence(a["images"][k]) == pytest.approx(_yes_evidence(record), abs=1e-5)


@needs_organism
def test_evaluators_route_which_image_questions_only_when_asked(organism_and_queries):
    model, processor, queries = organism_and_queries
    off = CropVerify(processor)
    HFModel(model, processor, mitigations=[off], max_new_tokens=8)(queries)
    assert off.stats["not_applicable"] == len(queries) and "which_image" not in off.stats
    on = CropVerify(processor, which_image=True)
    HFModel(model, processor, mitigations=[on], max_new_tokens=8)(queries)
    assert on.stats["which_image"]["queries"] == len(queries) and "not_applicable" not in on.stats


@needs_organism
def test_bad_input(organism_and_queries):
    model, processor, queries = organism_and_queries
    cv = CropVerify(processor)
    sets, prompts = [q.images for q in queries[:2]], [q.prompt for q in queries[:2]]
    with pytest.raises(ValueError, match="differ in number"):
        cv.answer_which_image(model, sets, prompts[:1])
    with pytest.raises(ValueError, match="list of PIL images"):
        cv.answer_which_image(model, [sets[0][0], sets[1]], prompts)
    with pytest.raises(ValueError, match="neither an 'in which image"):
        cv.answer_which_image(model, sets, ["is there a dog ?", prompts[1]])
    with pytest.raises(ValueError, match="template"):
        cv.answer_which_image(model, sets, prompts, template="is there one ?")
    for bad in ("yes", 1, "decomposed", "none"):
        with pytest.raises(ValueError, match="which_image"):
            CropVerify(processor, which_image=bad)


# -- "is there an X in any of these images?" (MIOH's comprehensive question) ----------------

@pytest.mark.parametrize("prompt, n, obj", [
    ("is there a banana in the images ? answer yes or no .", 4, "banana"),
    ("Is there at least one surfboard in any of these images?", 2, "surfboard"),
    ("analysis confirms there is no dog in the image . is there a dog in the images ? answer yes or no .", 3, "dog"),
    ("Is there an apple in those images? Answer yes or no.", 10, "apple"),
])
def test_parse_any_image(prompt, n, obj):
    parsed = parse_any_image(prompt, n)
    assert parsed is not None and parsed.object == obj and parsed.letters == {k: "yes" for k in range(n)}
    assert parse_multi_image(prompt, n) == parsed
    for answer, choice in [("yes", "yes"), ("Yes.", "yes"), ("no", "no"), ("maybe", None)]:
        assert parsed.choice(answer) == choice
    assert decide(parsed, {k: None for k in range(n)}, 0.5, decompose=True) == "none"  # "no"
    assert parsed.letters[decide(parsed, {0: 0.9, **{k: None for k in range(1, n)}}, 0.5, decompose=False)] == "yes"


@pytest.mark.parametrize("prompt, n", [
    ("is there a banana in the images ? answer yes or no .", 1),  # one image: a single-image question
    ("is there a banana in the image ? answer yes or no .", 2),  # "the image", not "the images"
    ("how many bananas are there in the images ?", 2),
    # MIOH's multiple-choice form: its answers are option letters, not yes / no
    ("Is there at least one dog in any of these images? A) Yes, all of them B) Yes, in some of them "
     "C) No, in none of them D) I don't know", 4),
    ("is there a difference between the dogs in these images ?", 2),  # comparative
    ("is there no dog in the images ?", 2),
])
def test_other_multi_image_questions_are_not_parsed(prompt, n):
    assert parse_any_image(prompt, n) is None and parse_multi_image(prompt, n) is None


@pytest.fixture(scope="module")
def comprehensive_queries(organism_and_queries):
    model, processor, _ = organism_and_queries
    return model, processor, [q for q in build(n_per_condition=4, seed=0) if q.record["qtype"] == "comprehensive"]


@needs_organism
def test_comprehensive_questions_verified_image_by_image(comprehensive_queries):
    """Default policy on "is there a X in the images ?": only an unconfident "no" is checked,
    and it becomes "yes" exactly when an image's final "yes" passes tau; tau = 1 changes
    nothing; under "decompose" an unconfident "yes" becomes "no" exactly when no image passes."""
    model, processor, queries = comprehensive_queries
    sets, prompts = [q.images for q in queries], [q.prompt for q in queries]
    plain = HFModel(model, processor, max_new_tokens=8)(queries)
    unchanged = CropVerify(processor, tau=1.0, which_image=True).answer_which_image(model, sets, prompts)
    assert [r["answer"] for r in unchanged] == plain
    for mode in (True, "decompose"):
        cv = CropVerify(processor, gate=1.0, tau=0.5, which_image=mode)
        results = cv.answer_which_image(model, sets, prompts, max_new_tokens=8)
        stats = cv.stats["which_image"]
        assert [r["first_answer"] for r in results] == plain
        for r, q in zip(results, queries):
            first = parse_any_image(q.prompt, len(q.images)).choice(r["first_answer"])
            if mode is True and first != "no":  # a "yes" is never checked by default
                assert not r["verified"] and r["answer"] == r["first_answer"]
                continue
            assert r["verified"] and sorted(r["images"]) == list(range(len(q.images)))
            passed = any(e is not None and e > 0.5 for e in (_yes_evidence(x) for x in r["images"].values()))
            assert r["answer"] == ("yes" if passed else "no" if mode == "decompose" else r["first_answer"])
        assert stats["overturned"] == sum(r["answer"] != r["first_answer"] for r in results) > 0
        assert stats["images_asked"] == sum(len(q.images) for q, r in zip(queries, results) if r["verified"])


@needs_organism
def test_evaluators_route_comprehensive_questions_only_when_asked(comprehensive_queries):
    model, processor, queries = comprehensive_queries
    queries = queries[:9]
    off = CropVerify(processor)
    HFModel(model, processor, mitigations=[off], max_new_tokens=8)(queries)
    assert off.stats["not_applicable"] == len(queries)
    on = CropVerify(processor, which_image=True)
    HFModel(model, processor, mitigations=[on], max_new_tokens=8)(queries)
    assert on.stats["which_image"]["queries"] == len(queries) and "not_applicable" not in on.stats
