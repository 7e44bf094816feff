"""Crop-and-verify through plain ``generate()`` and ``pipeline("image-text-to-text")``:
``attach(model, CropVerify(processor))`` gives the answers ``CropVerify.answer`` gives, on
the shipped organism; tau = 1 and detach leave the model exactly as it was; what cannot be
verified is counted and warned about or refused, never passed through silently."""

from __future__ import annotations

import functools

import pytest
import torch
from PIL import Image

from hooks import hook_state
from hooks.testing import TINY_MODEL_TYPES, build_tiny_model, tiny_image_features, tiny_image_processor, tiny_preprocess
from mitigate import CropVerify, attach
from mitigate.answer_kinds import count_value




@functools.lru_cache(maxsize=None)
def _full_view_queries(n_scenes: int, per_level: int, seed: int = 1) -> list:
    """DO-Bench Full-view questions at every prior level (levels 1-3 carry belief sentences)."""
    from evaluators.benchmarks.dobench.suite import build

    full = [q for q in build(n_scenes=n_scenes, seed=seed) if q.record["view"] == "Full"]
    return [q for level in range(4) for q in [q for q in full if q.record["level"] == level][:per_level]]


#: The object-token localiser (docs/report_organism.md, "Where the views are cut"). On organism v17 the
#: default localiser's window rarely lands on the object (6% of 100 scenes) and overturns no
#: answer among these queries; the tests that need overturned answers use this one (47%),
#: at the threshold they were written for (tau 0.5; the default is 0.8 since session 40, at
#: which these queries overturn nothing: the tests check the generate() route's wiring)
OBJECT = {"layers": [0], "queries": "object", "heads": "peak", "generic_prompt": None, "tau": 0.5}


@pytest.fixture(scope="module")
def queries():
    return _full_view_queries(6, 5)


@pytest.fixture(scope="module")
def more_queries():
    """40 questions: with the whole prompt and a control window, 20 held too few overturns."""
    return _full_view_queries(12, 10)


def _templated(processor, prompts):
    return [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
                                          add_generation_prompt=True) for p in prompts]


def _task_queries(generators, n, seed0):
    """Images and questions of ``n`` examples of each organism task generator, interleaved."""
    import numpy as np

    from evaluators.world import BIASED, World

    world = World(BIASED)
    examples = [task(world, np.random.default_rng(seed), seed0 + seed) for seed in range(n) for task in generators]
    return [e.images[0] for e in examples], [e.question for e in examples]


def _decode(processor, out, enc):
    return [t.strip() for t in processor.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]


#: Each setting on 40 questions where it overturns answers (the default overturns 1 of seed
#: 1's, 8 of seed 4's; the whole prompt with a control 5 of seed 1's and none of seed 4's).
@pytest.mark.parametrize("kwargs, seed", [({}, 4), ({"strip_priors": False, "control": True, **OBJECT}, 1),
                                          ({"locate": "embedding"}, 1), ({"locate": "zoom"}, 1)],
                         ids=["default", "whole-prompt+control", "embedding", "zoom"])
def test_generate_gives_the_answers_of_answer(organism, kwargs, seed):
    model, processor = organism
    more_queries = _full_view_queries(12, 10, seed)
    images, prompts = [q.images[0] for q in more_queries], [q.prompt for q in more_queries]
    reference = CropVerify(processor, **kwargs)
    expected = reference.answer(model, images, prompts, max_new_tokens=4)
    assert reference.stats["overturned"] >= 2, "the check must cover overturned answers"
    cv = CropVerify(processor, **kwargs)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert _decode(processor, out, enc) == [r["answer"] for r in expected]
    assert cv.stats == reference.stats
    # every row ends, the overturned ones too (a yes/no view answers with one token, then eos)
    eos = torch.tensor(model.generation_config.eos_token_id).reshape(-1)
    assert all(torch.isin(row[enc["input_ids"].shape[1]:], eos).any() for row in out)


def test_the_gate_reads_the_models_distribution_whatever_the_sampling_settings(organism):
    """Confidences came from generate()'s scores, after temperature / top-k / top-p: under
    Qwen2-VL-Instruct's shipped sampling config (top_k=1, top_p=0.001, temperature=0.01) every
    confidence was 1 and nothing was verified, silently. It is near-greedy: the answers and
    counts must be greedy answer()'s."""
    model, processor = organism
    queries = _full_view_queries(12, 10, 4)
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    reference = CropVerify(processor)
    expected = reference.answer(model, images, prompts, max_new_tokens=4)
    assert reference.stats["overturned"] >= 2
    cv = CropVerify(processor)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=True, top_k=1, top_p=0.001, temperature=0.01)
    assert _decode(processor, out, enc) == [r["answer"] for r in expected]
    assert cv.stats == reference.stats
    # and answer() under the same settings: its confidences do not move either
    sampled = CropVerify(processor)
    got = sampled.answer(model, images, prompts, max_new_tokens=4, do_sample=True, top_k=1, top_p=0.001,
                         temperature=0.01)
    assert [r["confidence"] for r in got] == pytest.approx([r["confidence"] for r in expected], abs=1e-6)
    assert sampled.stats == reference.stats


def test_an_overturned_answer_does_not_come_back_with_the_cache_of_the_first(organism):
    """The returned past_key_values held the first pass's "no" after it was overturned to
    "yes": a chat's next turn over it was conditioned on the discarded answer. It is None
    when an answer changed, and kept when none did."""
    from evaluators.world import BIASED, World
    from hooks.cache import output_cache

    model, processor = organism
    image = World(BIASED).scene(0).render()
    asked = {"bird": "is there a bird in the image ? answer yes or no .",
             "unchanged": "is there a dog in the image ? answer yes or no ."}
    for name, question in asked.items():
        cv = CropVerify(processor, tau=0.5)
        with attach(model, cv):
            enc = processor(text=_templated(processor, [question]), images=[image], return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
        if name == "bird":
            assert cv.stats["overturned"] == 1 and output_cache(out) is None
            assert all(v is None for k, v in out.items() if k in ("cache", "past_key_values"))  # the dict too
            # generate()'s first parameter given by name, inputs=, is the input ids as well
            with attach(model, CropVerify(processor, tau=0.5)) as handle:
                enc = processor(text=_templated(processor, [question]), images=[image], return_tensors="pt")
                named = model.generate(inputs=enc.pop("input_ids"), **enc, max_new_tokens=4, do_sample=False)
            assert torch.equal(named, out.sequences) and handle.mitigations[0].stats["overturned"] == 1
        else:
            assert cv.stats["overturned"] == 0 and output_cache(out) is not None


@pytest.mark.parametrize("limits, view_tokens", [
    ({"max_new_tokens": 1}, 1),
    ({"generation_config": "max_new_tokens=1"}, 3),  # the config's limit, not only the keyword's
    ({"max_new_tokens": 4, "min_new_tokens": 3}, 1),
    ({"max_length": "+1"}, 3),  # lengths counted from the prompt ("+N": its length plus N)
    ({"max_length": "+4", "min_length": "+3"}, 1),
], ids=["max1", "config-max1", "min3", "max_length1", "min_length3"])
def test_verified_rows_keep_the_callers_length_limits(organism, limits, view_tokens):
    """An overturned row is no longer than the call allows (a view cut at the caller's own
    limit is not closed with an extra eos), its yes/no views never answer past the call's
    max_new_tokens however it was given, and never end before its min_new_tokens."""
    from transformers import GenerationConfig

    from evaluators.organism.tasks import colour, counting, existence, prior_existence

    model, processor = organism
    if "generation_config" in limits:
        eos, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
        limits = {"generation_config": GenerationConfig(max_new_tokens=1, eos_token_id=eos, pad_token_id=pad)}
    images, prompts = _task_queries((existence, counting, prior_existence, colour), 5, 9 * 10**8)
    cv = CropVerify(processor, gate=1.0, tau=0.0, yes_no_view_tokens=view_tokens)
    with attach(model, cv):  # preprocessed while attached: the original images are remembered
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        start = enc["input_ids"].shape[1]
        limits = {k: start + int(v) if isinstance(v, str) else v for k, v in limits.items()}
        out = model.generate(**enc, do_sample=False, **limits)
    assert cv.stats["overturned"] >= 2
    most = (limits["generation_config"].max_new_tokens if "generation_config" in limits
            else limits.get("max_new_tokens", limits.get("max_length", 0) - start))
    assert out.shape[1] - start <= most
    least = limits.get("min_new_tokens", limits.get("min_length", start) - start)
    eos = model.generation_config.eos_token_id
    for row in out[:, start:].tolist():
        assert eos not in row or row.index(eos) >= least, row


@pytest.mark.parametrize("kwargs", [{}, OBJECT, {"locate": "embedding"}], ids=["default", "object", "embedding"])
def test_a_static_cache_gives_the_dynamic_caches_answers(organism, queries, kwargs):
    """Under ``cache_implementation="static"`` the verified answers and the counts equal the
    default cache's; ViCrop's generic map is then read from a forward of its own (the
    first answer's cache is reused only when it is a dynamic one), so only
    ``generic_from_cache`` differs."""
    model, processor = organism
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    runs = {}
    for cache in (None, "static"):
        cv = CropVerify(processor, **kwargs)
        with attach(model, cv):
            enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
            kw = {"cache_implementation": cache} if cache else {}
            out = model.generate(**enc, max_new_tokens=4, do_sample=False, **kw)
        stats = {k: v for k, v in cv.stats.items() if k != "generic_from_cache"}
        runs[cache] = (_decode(processor, out, enc), stats)
    assert runs["static"] == runs[None] and runs[None][1]["verified"] > 0


@pytest.mark.parametrize("batch_size", [1, 2])
def test_pipeline_is_verified_while_attached(organism, queries, batch_size):
    """Batched, the pipeline preprocesses one example at a time and stacks the pixels:
    the originals are still found, image by image (they were not at batch 2: nothing was
    verified and a warning blamed the processor)."""
    from transformers import pipeline

    model, processor = organism
    pipe = pipeline("image-text-to-text", model=model, processor=processor)
    messages = [[{"role": "user", "content": [{"type": "image", "image": q.images[0]}, {"type": "text", "text": q.prompt}]}]
                for q in queries]

    def answers():
        return [o[0]["generated_text"][-1]["content"].strip()
                for o in pipe(text=messages, max_new_tokens=4, batch_size=batch_size)]

    plain = answers()
    cv = CropVerify(processor, **OBJECT)
    with attach(model, cv):
        mitigated = answers()
    expected = CropVerify(processor, **OBJECT).answer(model, [q.images[0] for q in queries],
                                                      [q.prompt for q in queries], max_new_tokens=4)
    assert mitigated == [r["answer"] for r in expected]
    assert sum(a != b for a, b in zip(plain, mitigated)) == cv.stats["overturned"] > 0
    assert answers() == plain  # detached: the pipeline is the plain one again


def test_each_row_finds_its_own_original_when_another_batch_held_the_same_images(organism, queries):
    """The same images preprocessed again in the reverse order (a prefetching loader) after
    the batch generate() runs on: every row still verifies against its own original."""
    model, processor = organism
    rows = CropVerify(processor, **OBJECT).answer(model, [q.images[0] for q in queries], [q.prompt for q in queries],
                                                  max_new_tokens=4)
    first = next(i for i, r in enumerate(rows) if r["answer"] != r["first_answer"])
    chosen = queries[max(first - 4, 0):][:8]  # 8 rows, one of them overturned
    images, prompts = [q.images[0] for q in chosen], [q.prompt for q in chosen]
    expected = [r["answer"] for r in CropVerify(processor, **OBJECT).answer(model, images, prompts, max_new_tokens=4)]
    cv = CropVerify(processor, **OBJECT)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        processor(text=_templated(processor, prompts[::-1]), images=images[::-1], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert _decode(processor, out, enc) == expected and cv.stats["overturned"] > 0


def test_the_processor_prints_and_saves_as_it_would_unattached(organism, tmp_path):
    """The patched preprocess lives in the image processor's __dict__, which transformers
    serialises: repr(processor), print(processor.image_processor) and save_pretrained raised
    'Object of type function is not JSON serializable' while crop-and-verify was attached."""
    model, processor = organism
    plain = repr(processor)
    processor.image_processor.save_pretrained(tmp_path / "plain")
    with attach(model, CropVerify(processor)):
        assert repr(processor) == plain
        processor.image_processor.save_pretrained(tmp_path / "attached")
    assert (tmp_path / "attached" / "preprocessor_config.json").read_text() == \
        (tmp_path / "plain" / "preprocessor_config.json").read_text()
    assert "to_dict" not in vars(processor.image_processor)


def test_tau_one_and_detach_leave_generate_exactly_as_it_was(organism, queries):
    model, processor = organism
    images, prompts = [q.images[0] for q in queries[:6]], [q.prompt for q in queries[:6]]
    enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
    plain = model.generate(**enc, max_new_tokens=4, do_sample=False)
    # after a forward: transformers installs its output-recording hooks at a model's first one
    before = hook_state(model)
    cv = CropVerify(processor, tau=1.0)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        assert torch.equal(model.generate(**enc, max_new_tokens=4, do_sample=False), plain)
        as_dict = model.generate(**enc, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(as_dict.sequences, plain)
    assert cv.stats["verified"] == 0
    assert "generate" not in vars(model) and "preprocess" not in vars(processor.image_processor)
    assert hook_state(model) == before


def test_unverifiable_calls_are_counted_and_warned_or_refused(organism, queries):
    model, processor = organism
    images, prompts = [q.images[0] for q in queries[:6]], [q.prompt for q in queries[:6]]
    enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
    plain = model.generate(**enc, max_new_tokens=4, do_sample=False)
    cv = CropVerify(processor, gate=1.0)
    with attach(model, cv):  # preprocessed before attaching: the originals are unknown
        with pytest.warns(UserWarning, match="not verified.*not in DataLoader workers"):
            out = model.generate(**enc, max_new_tokens=4, do_sample=False)
        assert torch.equal(out, plain)
        # never a silent fall-back to plain decoding
        with pytest.raises(ValueError, match="; num_beams=2 is not supported"):
            model.generate(**enc, max_new_tokens=4, do_sample=False, num_beams=2)
        with pytest.raises(ValueError, match="; num_return_sequences=2 is not supported"):
            model.generate(**enc, max_new_tokens=4, do_sample=True, num_return_sequences=2)
        text_only = {k: v for k, v in enc.items() if k != "pixel_values"}
        with pytest.raises(ValueError, match="needs an image"):
            model.generate(**text_only, max_new_tokens=4)
    assert cv.stats["no_original"] > 0 and cv.stats["verified"] == 0
    with attach(model, CropVerify(processor, tau=1.0)):  # tau = 1: plain generate(), beams included
        beams = model.generate(**enc, max_new_tokens=4, do_sample=False, num_beams=2)
    assert torch.equal(beams, model.generate(**enc, max_new_tokens=4, do_sample=False, num_beams=2))


def test_inputs_preprocessed_long_before_are_verified_within_keep_originals_and_named_beyond(organism):
    """Only the last ``keep_originals`` preprocess calls' originals are kept (16 by default);
    an older call's rows were answered unverified with a warning to "preprocess while
    attached", which the caller had done."""
    model, processor = organism
    questions = _templated(processor, ["is there a bird in the image ? answer yes or no ."])
    from evaluators.world import BIASED, World

    images = [World(BIASED).scene(s).render() for s in range(3)]
    for keep, verified in ((2, False), (3, True)):
        cv = CropVerify(processor, gate=1.0, keep_originals=keep)
        with attach(model, cv):
            batches = [processor(text=questions, images=[im], return_tensors="pt") for im in images]
            if verified:
                model.generate(**batches[0], max_new_tokens=2, do_sample=False)
            else:
                with pytest.warns(UserWarning, match="preprocessed more than 2 preprocess calls before"):
                    model.generate(**batches[0], max_new_tokens=2, do_sample=False)
        assert cv.stats["verified"] == int(verified) and cv.stats.get("no_original", 0) == int(not verified)
    with pytest.raises(ValueError, match="keep_originals must be an int >= 1"):
        CropVerify(processor, keep_originals=0)


def test_a_request_preprocessed_in_another_thread_during_a_verification_is_recorded(organism):
    """The verifying call pauses the recording of its views' preprocessing; the pause was
    shared, so a request another thread preprocessed meanwhile was never recorded and its
    generate() answered unverified (a review). The pause is the verifying thread's own."""
    import threading

    from evaluators.world import BIASED, World
    from mitigate.crop_verify_generate import OriginalImages

    _, processor = organism
    first, second = (World(BIASED).scene(s).render() for s in (0, 1))
    originals = OriginalImages()
    originals.paused = True  # this thread is verifying: its own preprocess calls are the views'
    view = processor.image_processor([first], return_tensors="pt")
    originals.record([first], view)
    request = {}

    def other_thread():
        request["out"] = processor.image_processor([second], return_tensors="pt")
        originals.record([second], request["out"])

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert originals.find(view["pixel_values"]) is None  # the view: not recorded
    assert originals.find(request["out"]["pixel_values"]) == [second]  # the other thread's request: recorded


def test_an_image_too_small_for_views_is_a_clear_error_under_generate(organism):
    model, processor = organism
    cv = CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, cv):
        enc = processor(text=_templated(processor, ["is there a dog in the image ? answer yes or no ."]),
                        images=[Image.new("RGB", (6, 40), "white")], return_tensors="pt")
        with pytest.raises(ValueError, match="too small"):
            model.generate(**enc, max_new_tokens=2, do_sample=False)


def test_a_streamer_receives_the_verified_answer(organism, queries):
    """Tokens cannot be taken back once streamed, so the streamer gets the final answer
    (after verification), step by step; the views' pass never streams."""
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], 0

        def put(self, value):
            self.puts.append(value.clone())

        def end(self):
            self.ended += 1

    model, processor = organism
    cv = CropVerify(processor, **{**OBJECT, "gate": 1.0, "tau": 0.0})
    streamer = Collect()
    with attach(model, cv):
        found = None
        for q in queries:  # one query whose answer a view overturns
            enc = processor(text=_templated(processor, [q.prompt]), images=[q.images[0]], return_tensors="pt")
            before = cv.stats["overturned"]
            streamer.__init__()
            out = model.generate(**enc, max_new_tokens=4, do_sample=False, streamer=streamer)
            if cv.stats["overturned"] > before:
                found = (enc, out)
                break
    assert found is not None, "no query was overturned: the streamer test needs one"
    enc, out = found
    start = enc["input_ids"].shape[1]
    assert streamer.ended == 1 and torch.equal(streamer.puts[0], enc["input_ids"])
    streamed = torch.stack([p.reshape(-1) for p in streamer.puts[1:]], dim=1)
    assert torch.equal(streamed, out[:, start:])  # exactly the returned (verified) tokens
    plain = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert not torch.equal(out, plain)  # ... which are not what the first pass produced


def test_boxes_and_captions_are_never_reasked(organism):
    """A view's box is in the view's coordinates and its caption describes the view: such
    answers stay the first pass's, are counted, and cost no extra pass."""
    from evaluators.organism.tasks import caption, grounding

    model, processor = organism
    images, prompts = _task_queries((caption, grounding), 6, 6 * 10**8)
    cv = CropVerify(processor, gate=1.0, tau=0.0)
    records = cv.answer(model, images, prompts, max_new_tokens=12)
    # every caption and every grounding answer ("none" included) is left alone
    assert any(r["first_answer"] == "none" for r in records[1::2]), "no grounding abstention among the answers"
    for record in records:
        assert not record["verified"] and record["answer"] == record["first_answer"]
    assert cv.stats["not_verifiable"] == len(records) and cv.stats["verified"] == 0


def test_attach_refuses_what_it_cannot_do(organism):
    model, processor = organism
    with pytest.raises(ValueError, match="pair"):
        attach(model, CropVerify(processor, views=("crop", "pair")))
    with pytest.raises(ValueError, match="processor"):
        attach(model, CropVerify(None))
    assert "generate" not in vars(model)


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_a_view_resized_to_its_original_keeps_the_token_count(model_type):
    """Why the views can reuse the caller's prompt ids: on every family's own preprocessing,
    a crop resized to the original's size gets exactly the original's image tokens."""
    model = build_tiny_model(model_type)
    processor = tiny_image_processor(model_type)
    for size in ((96, 64), (64, 96), (80, 80)):
        original = Image.new("RGB", size, (30, 90, 160))
        view = original.crop((10, 5, 50, 40)).resize(size, Image.BICUBIC)
        counts = [len(tiny_image_features(model, tiny_preprocess(model_type, [[im]], processor))) for im in (original, view)]
        assert counts[0] == counts[1], (model_type, size, counts)


def test_views_are_asked_the_prompt_answer_asks_them(organism, queries):
    """strip_priors deletes the belief sentences' tokens from the views' rows: each row is
    the token sequence answer() builds from the stripped text (the organism's tokenizer is
    word-level), left-padded, with its mask -- not the caller's row with a masked gap."""
    from hooks import resolve
    from mitigate.crop_verify import without_priors
    from mitigate.crop_verify_generate import _without_prior_tokens

    model, processor = organism
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    assert sum(without_priors(p) != p for p in prompts) >= 10, "levels 1-3 must carry belief sentences"
    enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
    views = _without_prior_tokens(dict(enc), resolve(model), processor.tokenizer)
    stripped = processor(text=_templated(processor, [without_priors(p) for p in prompts]), images=images,
                         return_tensors="pt", padding=True)
    assert views["input_ids"].shape[1] < enc["input_ids"].shape[1]
    for row in range(len(prompts)):
        got = views["input_ids"][row][views["attention_mask"][row].bool()]
        want = stripped["input_ids"][row][stripped["attention_mask"][row].bool()]
        assert got.tolist() == want.tolist(), prompts[row]
        assert not views["attention_mask"][row][-1] == 0  # left padding: the last token is real
    level0 = [i for i, p in enumerate(prompts) if without_priors(p) == p]
    plain = processor(text=_templated(processor, [prompts[i] for i in level0]), images=[images[i] for i in level0],
                      return_tensors="pt", padding=True)
    untouched = dict(plain)
    assert _without_prior_tokens(untouched, resolve(model), processor.tokenizer) is untouched


def test_composes_with_contrast_mitigations(organism, queries):
    """attach(model, VCD(), CropVerify(...)): the first pass and the views are decoded with
    VCD, as CropVerify.answer() under attach(model, VCD()) decodes them (the evaluators'
    route) -- the same answers and stats -- and detach restores every hook."""
    from mitigate import VCD

    model, processor = organism
    images, prompts = [q.images[0] for q in queries], [q.prompt for q in queries]
    reference = CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, VCD()):
        expected = reference.answer(model, images, prompts, max_new_tokens=4)
    assert reference.stats["overturned"] > 0
    before = hook_state(model)  # after a first forward: transformers installs its output recorders lazily
    cv = CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, VCD(), cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert hook_state(model) == before
    assert _decode(processor, out, enc) == [r["answer"] for r in expected]
    assert cv.stats == reference.stats


def _word_tokenizer(vocab_size: int, pad_id: int):
    """A word-level tokenizer over ``w0 .. w{vocab_size-1}``: decodes any id of a tiny model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(words, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=f"w{pad_id}")


def _noise_images(seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy())
            for w, h in ((96, 64), (64, 96))]


@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_generate_path_localises_and_reasks_on_every_family(model_type):
    """The generate() path end to end on every family's own preprocessing (tiles, AnyRes,
    dynamic resolution): the maps captured at the caller's prefill, views cut from the
    originals, resized, re-asked with the caller's prompt ids -- every row verified, none
    lost, the prompt part of each returned row untouched; detach restores the model."""
    from types import SimpleNamespace

    from hooks.testing import tiny_inputs

    model = build_tiny_model(model_type)
    text_config = model.config.get_text_config()
    pad = text_config.pad_token_id if text_config.pad_token_id is not None else model.config.pad_token_id
    image_processor = tiny_image_processor(model_type)
    processor = SimpleNamespace(tokenizer=_word_tokenizer(text_config.vocab_size, pad), image_processor=image_processor)
    images = _noise_images()
    inputs = tiny_inputs(model, images=images)
    with torch.no_grad():
        plain = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    cv = CropVerify(processor, gate=1.0, tau=0.0, generic_prompt=None, heads="peak")  # verify every row
    with attach(model, cv), torch.no_grad():
        tiny_preprocess(model_type, [[im] for im in images], image_processor)  # the caller's preprocessing, as its processor runs it
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    start = inputs["input_ids"].shape[1]
    assert cv.stats["queries"] == 2 and cv.stats["verified"] == 2, cv.stats
    assert "no_original" not in cv.stats and "not_applicable" not in cv.stats
    assert torch.equal(out[:, :start], plain[:, :start])
    with torch.no_grad():
        assert torch.equal(model.generate(**inputs, max_new_tokens=3, do_sample=False), plain)


@pytest.mark.parametrize("cache", [None, "static"])
@pytest.mark.parametrize("model_type", TINY_MODEL_TYPES)
def test_maps_captured_in_generate_equal_a_forward_of_their_own(model_type, cache):
    """Localising from the caller's generate() prefill reads the same attention (within
    1e-5) as localising with a forward of its own, on every family, and yields boxes --
    also under a static cache, whose keys are a buffer longer than the prompt (the capture
    failed on it)."""
    from hooks import resolve
    from hooks.testing import tiny_inputs
    from mitigate.localize import boxes_from_maps, capture_first_pass, image_attention_maps

    model = build_tiny_model(model_type)
    images = _noise_images(1)
    inputs = tiny_inputs(model, images=images)
    with torch.no_grad():
        separate = image_attention_maps(model, inputs, queries="question")
        with capture_first_pass(model, inputs, queries="question") as captured:
            kw = {"cache_implementation": cache} if cache else {}
            model.generate(**inputs, max_new_tokens=2, do_sample=False, **kw)
    assert len(captured["maps"]) == len(separate) == 2
    for a, b in zip(captured["maps"], separate):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    boxes = boxes_from_maps(resolve(model), captured["maps"], inputs, [0, 1], [im.size for im in images])
    for (x0, y0, x1, y1), im in zip(boxes, images):
        assert 0 <= x0 < x1 <= im.width and 0 <= y0 < y1 <= im.height


def test_counting_and_colour_questions_through_generate(organism):
    """Counting and attribute questions take the same generate() path as existence ones:
    the same answers and stats as CropVerify.answer (which picks a view's answer when it is
    more confident than the first and than tau), with some answers replaced by a view."""
    from evaluators.organism.tasks import colour, counting

    model, processor = organism
    images, prompts = _task_queries((colour, counting), 10, 7 * 10**8)
    reference = CropVerify(processor, gate=1.0, tau=0.0)
    expected = reference.answer(model, images, prompts, max_new_tokens=4)
    assert reference.stats["verified"] == len(prompts) and reference.stats["overturned"] > 0
    cv = CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert _decode(processor, out, enc) == [r["answer"] for r in expected]
    assert cv.stats == reference.stats
    for r in expected:  # a view holds at most the image's instances: counts only ever go up
        if r.get("kind") == "count" and r.get("chosen"):
            assert count_value(r["answer"]) > count_value(r["first_answer"]), r


def test_each_gated_row_is_judged_by_its_own_question(organism):
    """Counting and existence questions in one batch, only some rows gated: generate() gives
    what answer() gives, so the combine policy read each gated row's own question (a "how
    many" question turns a "no" into a count of 0)."""
    from evaluators.organism.tasks import counting, existence

    model, processor = organism
    images, prompts = _task_queries((counting, existence), 12, 8 * 10**8)
    reference = CropVerify(processor, tau=0.0)
    expected = reference.answer(model, images, prompts, max_new_tokens=4)
    assert 0 < reference.stats["verified"] < len(prompts)
    cv = CropVerify(processor, tau=0.0)
    judged = []  # (first answer, question) as the combine policy received them
    decide = cv._decide
    cv._decide = lambda result, *args, **kw: judged.append((result["first_answer"], args[-1])) or decide(result, *args,
                                                                                                        **kw)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert _decode(processor, out, enc) == [r["answer"] for r in expected]
    assert cv.stats == reference.stats
    gated = [i for i, r in enumerate(expected) if r["verified"]]
    own = [processor.tokenizer.decode(enc["input_ids"][i], skip_special_tokens=True) for i in gated]
    assert [q for _, q in judged] == own


def test_pixel_fingerprints_match_a_cast_exactly_but_not_another_image_or_order():
    from mitigate.crop_verify_generate import _CASTS, _fingerprint, _matches, _probe

    torch.manual_seed(0)
    pixels = torch.randn(8, 3, 64, 64)
    recorded = _fingerprint(pixels, _CASTS)
    assert len(recorded) == 3  # float32 and its two rounding casts; float64 is found by casting back
    for cast in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert _matches(_probe(pixels.to(cast)), recorded)
        assert all(_matches(_probe(row.to(cast)), _fingerprint(row, _CASTS)) for row in pixels)
    nudged = pixels[0].clone()
    nudged[0, 5, 7] += 1e-3  # one value of one image, far below any tolerance a sum could have
    assert not _matches(_probe(nudged), _fingerprint(pixels[0], _CASTS))
    assert not _matches(_probe(pixels.flip(0)), recorded)  # the same images, reordered
    wide = pixels[0].double()
    wide[1, 2, 3] += 1e-12  # float64 detail float32 cannot hold: casting back would round it away
    assert wide.float().equal(pixels[0])
    assert not _matches(_probe(wide), _fingerprint(pixels[0], _CASTS))
    half = pixels[0].half()  # recorded in a narrow dtype, received widened or narrowed again
    for cast in (torch.float32, torch.float64, torch.bfloat16):
        assert _matches(_probe(half.to(cast)), _fingerprint(half, _CASTS))
    flat = torch.ones(3, 336, 336)  # a white image with one grey square, normalised as CLIP does
    flat[:, 100:150, 100:150] = 0.5
    flat = (flat - 0.48) / 0.27
    assert all(_matches(_probe(flat.to(cast)), _fingerprint(flat, _CASTS)) for cast in (torch.bfloat16, torch.float16))


def test_each_row_gets_its_own_original_even_when_the_pixels_nearly_agree():
    """Two images whose pixels differ by less than a bf16 rounding (a detail the resize all
    but erased): preprocessed in one call, each row gets its own original, in any dtype;
    preprocessed in separate calls, float32 pixels still tell them apart, and bf16 pixels
    that two different images share are ambiguous -- never another row's image. The
    tolerant fingerprints gave row 1 row 0's image."""
    from mitigate.crop_verify_generate import OriginalImages

    torch.manual_seed(0)
    background = torch.rand(3, 32, 32)
    pasted = background.clone()
    pasted[:, 16, 16] += 1e-4  # below bf16's resolution of these values
    a, b = Image.new("RGB", (64, 64), "white"), Image.new("RGB", (64, 64), "black")
    together = OriginalImages()
    together.record([a, b], {"pixel_values": torch.stack([background, pasted])})
    for cast in (torch.float32, torch.bfloat16, torch.float16):
        assert together.find(torch.stack([background, pasted]).to(cast)) == [a, b]
    assert together.find(torch.stack([pasted, background])) == [b, a]  # reordered: row by row, exactly
    apart = OriginalImages()
    apart.record([a], {"pixel_values": background[None]})
    apart.record([b], {"pixel_values": pasted[None]})
    assert apart.find(torch.stack([background, pasted])) == [a, b]
    from mitigate.crop_verify_generate import Unusable

    found = apart.find(torch.stack([background, pasted]).to(torch.bfloat16))
    assert all(isinstance(f, Unusable) and "ambiguous" in f.reason for f in found)
    again = OriginalImages()  # the same picture preprocessed twice, two PIL objects: not ambiguous
    again.record([a], {"pixel_values": background[None]})
    again.record([a.copy()], {"pixel_values": background[None]})
    assert again.find(background[None].to(torch.bfloat16))[0].tobytes() == a.tobytes()
    assert apart.find(torch.rand(2, 3, 32, 32)) is None


def test_views_are_preprocessed_with_the_settings_of_their_originals_call():
    """Each recorded image keeps the keyword settings its preprocess call had (InternVL's
    processor adds crop_to_patches=True at call time); the views of a generate() call are
    made with them. Rows preprocessed with other settings than the call's first row are not
    verified (their views would get other token counts) and say why."""
    from mitigate.crop_verify_generate import OriginalImages, Unusable, one_setting, preprocess_settings

    torch.manual_seed(1)
    x, y = torch.rand(3, 8, 8), torch.rand(3, 8, 8)
    a, b = Image.new("RGB", (64, 64), "white"), Image.new("RGB", (64, 64), "black")
    seen = OriginalImages()
    kwargs = {"return_tensors": "pt", "crop_to_patches": True, "input_data_format": "channels_last",
              "do_rescale": False}  # how the caller's inputs came is not the views' (PIL, 0-255)
    assert preprocess_settings(kwargs) == {"crop_to_patches": True}
    seen.record([a], {"pixel_values": x[None]}, settings=preprocess_settings(kwargs))
    seen.record([b], {"pixel_values": y[None]}, settings={})
    images, settings = one_setting(seen.find_originals(x[None]))
    assert images == [a] and settings == {"crop_to_patches": True}
    images, settings = one_setting(seen.find_originals(torch.stack([x, y])))
    assert images[0] == a and settings == {"crop_to_patches": True}
    assert isinstance(images[1], Unusable) and "other settings" in images[1].reason
    assert one_setting(None) == (None, {})


def _counterfactual_pair():
    """The reviewer's pair: a scene's background at 2048 px, and the same with its object
    pasted small (12 px) into it; a detector's box around the paste."""
    from evaluators.world import BIASED, World, edits

    scene = World(BIASED).scene(0)
    obj = scene.get(0)
    background = edits.remove(scene, obj.uid).render().resize((2048, 2048), Image.BICUBIC)
    x0, y0, x1, y1 = (int(v) for v in obj.box)
    with_object = background.copy()
    with_object.paste(scene.render().crop((max(x0 - 2, 0), max(y0 - 2, 0), x1 + 2, y1 + 2)).resize((12, 12)),
                      (1000, 1000))
    return [background, with_object], [f"is there a {obj.category} in the image ? answer yes or no ."] * 2


def test_a_counterfactual_pair_is_verified_each_row_on_its_own_original(organism):
    """[background, background + a small object] in one batch: answer() overturns row 1 to
    "yes" from its crop; attached, row 1's views were cut from row 0's image and it stayed
    "no". Also a world scene beside itself minus one object (2% of such pairs were confused)."""
    from evaluators.world import BIASED, World, edits

    model, processor = organism
    images, prompts = _counterfactual_pair()
    box = lambda image, prompt: (998, 998, 1014, 1014)  # noqa: E731 -- a detector's box
    expected = CropVerify(processor, gate=1.0, tau=0.0, localizer=box).answer(model, images, prompts,
                                                                              max_new_tokens=3)
    assert [r["answer"] for r in expected] == ["no", "yes"]
    cv = CropVerify(processor, gate=1.0, tau=0.0, localizer=box)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        assert model.generate.originals.find(enc["pixel_values"]) == images
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert _decode(processor, out, enc) == ["no", "yes"] and cv.stats["overturned"] == 1
    scene = World(BIASED).scene(2)
    pair = [edits.remove(scene, 1).render(), scene.render()]
    with attach(model, CropVerify(processor)):
        enc = processor(text=_templated(processor, prompts), images=pair, return_tensors="pt")
        assert model.generate.originals.find(enc["pixel_values"].to(torch.bfloat16)) == pair


def _random_organism():
    """The organism's architecture with random weights: every answer unconfident, so every
    row is gated."""
    from evaluators.organism import tasks
    from evaluators.organism.package import build_model_config, build_processor, build_tokenizer
    from transformers import LlavaForConditionalGeneration

    processor = build_processor(build_tokenizer(tasks.vocabulary()))
    torch.manual_seed(0)
    return LlavaForConditionalGeneration(build_model_config(len(processor.tokenizer))).eval(), processor


def test_array_and_tensor_images_are_verified_as_their_pil_images():
    """Images given as torch (C, H, W) tensors or one 4-D numpy batch -- which the processor
    accepts -- are verified as the same PIL images are; a float image in [0, 1] is verified
    when the processor takes it as it is (do_rescale=False), and where do_rescale=True
    rescales it again its range is ambiguous: unverified, the warning naming the input."""
    import numpy as np

    from evaluators.world import BIASED, World

    model, processor = _random_organism()
    images = [World(BIASED).scene(i).render() for i in range(2)]
    prompts = _templated(processor, ["is there a dog in the image ? answer yes or no ."] * 2)
    arrays = [np.array(im) for im in images]

    seen = []

    def run(given, **kwargs):
        cv = CropVerify(processor, gate=1.0, tau=0.0)
        group, recorded = _tower_inputs(model)
        with attach(model, cv), group:
            enc = processor(text=prompts, images=given, return_tensors="pt", padding=True, **kwargs)
            out = model.generate(**enc, max_new_tokens=2, do_sample=False)
        seen.extend(recorded)
        return _decode(processor, out, enc), cv.stats

    expected, stats = run(images)
    pil_views = seen[-1]  # the views' prefill
    assert stats["verified"] == 2
    for given in ([torch.from_numpy(a).permute(2, 0, 1) for a in arrays], np.stack(arrays)):
        assert run(given) == (expected, stats)
    got, float_stats = run([torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays], do_rescale=False)
    assert float_stats["verified"] == 2 and "no_original" not in float_stats
    # the views are PIL images in 0-255: the caller's do_rescale=False is not theirs (a
    # review found them reaching the model 255 times too large, max |x| 441)
    torch.testing.assert_close(seen[-1], pil_views, atol=1e-5, rtol=0)
    with pytest.warns(UserWarning, match=r"torch tensor image of shape \(3, \d+, \d+\) and dtype float32 has "
                                         r"float values in \[0, 1\]"):
        _, stats = run([torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrays])
    assert stats["no_original"] == 2 and stats["verified"] == 0


def test_tau_one_counts_queries_and_answers_any_size_on_both_routes(organism):
    """tau = 1 is the unmitigated model on both routes: both count the queries, neither
    refuses an image too small for views (no view is cut)."""
    model, processor = organism
    images = [Image.new("RGB", (6, 40), "white"), Image.new("RGB", (64, 64), "white")]
    prompts = ["is there a dog in the image ? answer yes or no ."] * 2
    reference = CropVerify(processor, tau=1.0)
    expected = [r["answer"] for r in reference.answer(model, images, prompts, max_new_tokens=3)]
    cv = CropVerify(processor, tau=1.0)
    with attach(model, cv):
        enc = processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert _decode(processor, out, enc) == expected
    assert cv.stats == reference.stats == {"queries": 2, "verified": 0, "overturned": 0}


@pytest.mark.parametrize("model_type", ["llava_next", "llava_onevision"])
def test_anyres_images_too_thin_for_a_tile_column_are_verified(model_type):
    """A 20 x 1000 image unpads to no column of high-resolution tokens: generate() raised
    'invalid region ... cols=0' after its first pass; its base image localises instead."""
    from types import SimpleNamespace

    from hooks.testing import tiny_inputs

    model = build_tiny_model(model_type)
    text_config = model.config.get_text_config()
    pad = text_config.pad_token_id if text_config.pad_token_id is not None else model.config.pad_token_id
    image_processor = tiny_image_processor(model_type)
    processor = SimpleNamespace(tokenizer=_word_tokenizer(text_config.vocab_size, pad), image_processor=image_processor)
    images = [Image.new("RGB", (20, 1000), (120, 30, 200)), Image.new("RGB", (1000, 20), (120, 30, 200))]
    inputs = tiny_inputs(model, images=images)
    cv = CropVerify(processor, gate=1.0, tau=0.0, generic_prompt=None, heads="peak")
    with attach(model, cv), torch.no_grad():
        tiny_preprocess(model_type, [[im] for im in images], image_processor)
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert cv.stats["verified"] == 2 and "no_original" not in cv.stats


def _video_llava_with_word_processor():
    """Tiny Video-LLaVA (its processor cuts the centre square), its image processor, and a
    processor of that image processor and a word tokenizer over the model's ids."""
    from types import SimpleNamespace

    model = build_tiny_model("video_llava")
    text_config = model.config.get_text_config()
    image_processor = tiny_image_processor("video_llava")
    return model, image_processor, SimpleNamespace(
        tokenizer=_word_tokenizer(text_config.vocab_size, text_config.pad_token_id), image_processor=image_processor)


def _tower_inputs(model):
    """A hook group recording every pixel tensor the vision tower receives, and that list."""
    from hooks import HookGroup, resolve

    seen: list = []
    group = HookGroup("tower pixels")
    group.add_forward_pre_hook(resolve(model).vision_encoder,
                               lambda module, args, kwargs: seen.append((args[0] if args else kwargs["pixel_values"]).clone()))
    return group, seen


def test_generate_path_asks_a_centre_cropping_processor_the_whole_view():
    """Video-LLaVA's processor (like LLaVA-1.5's) cuts the centre square of each image. Under
    ``attach()`` the views are framed for it (``view_image(..., shown)``): the tower receives
    each square view as that view cut alone would reach it, on a wide and a tall image, with
    the object near the edge the centre square cuts off. Stretched to the image's size, as
    before, the same views lost a side each."""
    import numpy as np

    from evaluators.world.views import cluster_box, crop_box, cut
    from hooks.testing import tiny_inputs

    model, image_processor, processor = _video_llava_with_word_processor()
    rng = np.random.default_rng(5)
    images = [Image.fromarray((rng.random((h // 16, w // 16, 3)) * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
              for w, h in ((192, 128), (128, 192))]
    boxes = {(192, 128): (150.0, 50.0, 170.0, 70.0), (128, 192): (50.0, 150.0, 70.0, 170.0)}
    cv = CropVerify(processor, gate=1.0, tau=0.0, localizer=lambda im, p: boxes[im.size])
    inputs = tiny_inputs(model, images=images)
    group, seen = _tower_inputs(model)
    with attach(model, cv), group, torch.no_grad():
        image_processor(images=images, return_tensors="pt")  # the caller's preprocessing
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert cv.stats["verified"] == 2, cv.stats
    views = seen[-1]  # the views' prefill: query by query, cv.views in order
    assert len(views) == 2 * len(cv.views)
    for q, image in enumerate(images):
        box = boxes[image.size]
        for v, view_box in enumerate([crop_box(box, *image.size, cv.margin), cluster_box(box, [], *image.size, cv.margin)]):
            alone = image_processor(images=[cut(image, view_box)], return_tensors="pt")
            alone = next(t for k, t in alone.items() if k.startswith("pixel_values"))[0]
            assert float((views[q * len(cv.views) + v] - alone).abs().mean()) < 0.05, (image.size, view_box)


def test_the_views_frame_follows_the_callers_own_preprocessing_settings():
    """A caller who overrides the crop at call time (Video-LLaVA's processor asked to resize
    to a square, no centre square cut) gets views framed for what that call showed -- the
    whole image -- not for the processor's saved settings: the tower receives each view as
    that call preprocesses the plain view."""
    import numpy as np

    from evaluators.world.views import crop_box
    from hooks.testing import tiny_inputs
    from mitigate.crop_verify import view_image

    model, image_processor, processor = _video_llava_with_word_processor()
    rng = np.random.default_rng(6)
    image = Image.fromarray((rng.random((8, 12, 3)) * 255).astype(np.uint8)).resize((192, 128), Image.BICUBIC)
    box = (150.0, 50.0, 170.0, 70.0)
    square = {"size": {"height": 32, "width": 32}}  # squashed to the tower's square: nothing cut
    cv = CropVerify(processor, gate=1.0, tau=0.0, views=("crop",), localizer=lambda im, p: box)
    inputs = tiny_inputs(model, images=[image])
    caller = tiny_preprocess("video_llava", [image], image_processor, **square)
    name = next(k for k in caller if k.startswith("pixel_values"))
    inputs[name] = caller[name]
    group, seen = _tower_inputs(model)
    with attach(model, cv), group, torch.no_grad():
        tiny_preprocess("video_llava", [image], image_processor, **square)  # the caller's preprocessing
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert cv.stats["verified"] == 1, cv.stats
    plain = view_image(image, crop_box(box, *image.size, cv.margin))  # no framing: the call showed everything
    expected = tiny_preprocess("video_llava", [plain], image_processor, **square)[name][0]
    torch.testing.assert_close(seen[-1][0], expected, atol=1e-5, rtol=0)


def _two_questions(processor):
    """Two full-view DO-Bench questions whose first answers are "no" (so the views run),
    preprocessed by ``processor`` (call it while crop-and-verify is attached: it records the
    originals the views are cut from)."""
    queries = _full_view_queries(6, 5)
    images, prompts = [q.images[0] for q in queries[:2]], [q.prompt for q in queries[:2]]
    return processor(text=_templated(processor, prompts), images=images, return_tensors="pt", padding=True)


def test_beams_and_sequences_from_the_models_generation_config_are_refused_whatever_config_the_call_passes(organism):
    """A GenerationConfig leaves what it does not set to None and generate() takes the model's
    (a checkpoint's generation_config.json with num_beams / num_return_sequences): crop-and-
    verify read only the call's config, let 2 sequences per prompt through and verified the
    wrong rows (prompt 1's question on prompt 0's second sequence), silently. Positional
    arguments after the ids (generation_config, logits_processor) were dropped."""
    from transformers import GenerationConfig

    model, processor = organism
    saved = model.generation_config.num_return_sequences, model.generation_config.num_beams
    try:
        with attach(model, CropVerify(processor, gate=1.0, tau=0.0)), torch.no_grad():
            enc = _two_questions(processor)
            model.generation_config.num_return_sequences, model.generation_config.num_beams = 2, 2
            with pytest.raises(ValueError, match="num_beams=2 and num_return_sequences=2 is not supported"):
                model.generate(**enc, generation_config=GenerationConfig(max_new_tokens=3))
            model.generation_config.num_return_sequences, model.generation_config.num_beams = saved
            ids = enc["input_ids"]
            rest = {k: v for k, v in enc.items() if k != "input_ids"}
            with pytest.raises(ValueError, match="num_beams=3"):
                model.generate(ids, GenerationConfig(max_new_tokens=3, num_beams=3), **rest)
            positional = model.generate(ids, GenerationConfig(max_new_tokens=3, do_sample=False), **rest)
            keyword = model.generate(**enc, max_new_tokens=3, do_sample=False)
    finally:
        model.generation_config.num_return_sequences, model.generation_config.num_beams = saved
    assert torch.equal(positional, keyword)


def test_a_call_with_a_generation_config_answers_as_one_with_keywords_and_returns_what_it_asks(organism, caplog):
    """The views' token limit and the gate's output_logits go into a copy of the call's
    generation_config (transformers warns about a config beside generation keywords), and
    return_dict_in_generate from the model's config gives generate()'s output object, as
    plain generate() does (a bare tensor came back)."""
    import logging

    from transformers import GenerationConfig

    model, processor = organism
    keyword_cv, config_cv = CropVerify(processor, gate=1.0, tau=0.0), CropVerify(processor, gate=1.0, tau=0.0)
    with attach(model, keyword_cv), torch.no_grad():
        enc = _two_questions(processor)
        keyword = model.generate(**enc, max_new_tokens=4, do_sample=False)
    saved = model.generation_config.return_dict_in_generate
    try:
        model.generation_config.return_dict_in_generate = True
        with attach(model, config_cv), torch.no_grad(), caplog.at_level(logging.WARNING):
            enc = _two_questions(processor)
            out = model.generate(**enc, generation_config=GenerationConfig(max_new_tokens=4, do_sample=False))
    finally:
        model.generation_config.return_dict_in_generate = saved
    assert keyword_cv.stats["verified"] == 2 and config_cv.stats == keyword_cv.stats
    assert torch.equal(out.sequences, keyword)
    assert not [r for r in caplog.records if "together with generation-related" in r.getMessage()]


def test_each_view_is_decoded_under_its_own_rows_prefix_allowed_tokens_fn(organism):
    """The views' generate() numbered its rows by the views' batch: row 1's view was decoded
    under row 0's constraint (and with more rows verified, the function got ids the caller
    never had)."""
    model, processor = organism
    tok = processor.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    allowed = {0: [yes, tok.eos_token_id], 1: [no, tok.eos_token_id]}
    seen = []

    def constraint(row, ids):
        seen.append(row)
        return allowed[row]

    cv = CropVerify(processor, gate=1.0, tau=0.0)  # verify every "no", take any view's "yes"
    with attach(model, cv), torch.no_grad():
        enc = _two_questions(processor)
        out = model.generate(**enc, max_new_tokens=3, do_sample=False, prefix_allowed_tokens_fn=constraint)
    assert cv.stats["verified"] == 1  # row 1's "no" (row 0 must say "yes")
    assert _decode(processor, out, enc) == ["yes", "no"]
    assert set(seen) == {0, 1}


def test_a_cache_object_the_caller_passes_is_not_handed_to_the_views(organism):
    """The views' generate() got the caller's cache, already filled by the first pass:
    'Image features and image tokens do not match'."""
    from transformers import DynamicCache

    model, processor = organism
    answers = []
    for cache in (None, DynamicCache(config=model.config)):
        cv = CropVerify(processor, gate=1.0, tau=0.0)
        with attach(model, cv), torch.no_grad():
            enc = _two_questions(processor)
            extra = {} if cache is None else {"cache": cache}
            answers.append(model.generate(**enc, max_new_tokens=3, do_sample=False, **extra))
        assert cv.stats["verified"] == 2
    assert torch.equal(answers[0], answers[1])


def test_prior_suppression_with_the_callers_spans_is_refused_beside_crop_and_verify(organism):
    """Spans naming the caller's rows and texts cannot apply to crop-and-verify's own batches
    (views, the generic prompt): every order, one attach() or two, is refused naming both;
    detection (spans=None) composes."""
    from mitigate import PriorSuppression

    model, processor = organism
    spans = [["i think"], ["i think"]]
    with pytest.raises(ValueError, match="crop_verify cannot run beside prior_suppression"):
        attach(model, PriorSuppression(processor.tokenizer, spans=spans), CropVerify(processor))
    with attach(model, CropVerify(processor)):
        with pytest.raises(ValueError, match="spans=None"):
            attach(model, PriorSuppression(processor.tokenizer, spans=spans))
    with attach(model, PriorSuppression(processor.tokenizer, spans=spans)):
        with pytest.raises(ValueError, match="names rows and texts of the caller's batch"):
            attach(model, CropVerify(processor))
    with attach(model, PriorSuppression(processor.tokenizer), CropVerify(processor)):
        pass
    assert "_mitigation_handles" not in vars(model)


@pytest.mark.parametrize("wrapper", ["star_args", "named_generate_kwargs"])
def test_positional_arguments_reach_a_wrapped_generate(organism, wrapper):
    """A model class whose generate() wraps the library's (PEFT-style generate(self, *args,
    **kwargs); BLIP-2's **generate_kwargs): its positional ids are read as generate() reads
    them (binding to the wrapper's own signature lost them)."""
    model, processor = organism
    base = type(model)

    class StarArgs(base):
        def generate(self, *args, **kwargs):
            return super().generate(*args, **kwargs)

    class NamedKwargs(base):
        def generate(self, input_ids=None, pixel_values=None, **generate_kwargs):
            return super().generate(input_ids=input_ids, pixel_values=pixel_values, **generate_kwargs)

    cls = {"star_args": StarArgs, "named_generate_kwargs": NamedKwargs}[wrapper]
    plain = None
    try:
        for kind in (base, cls):
            model.__class__ = kind
            cv = CropVerify(processor, gate=1.0, tau=0.0)
            with attach(model, cv), torch.no_grad():
                enc = _two_questions(processor)
                rest = {k: v for k, v in enc.items() if k not in ("input_ids", "pixel_values")}
                out = model.generate(enc["input_ids"], enc["pixel_values"], **rest, max_new_tokens=3, do_sample=False) \
                    if kind is NamedKwargs else \
                    model.generate(enc["input_ids"], pixel_values=enc["pixel_values"], **rest, max_new_tokens=3,
                                   do_sample=False)
            assert cv.stats["verified"] == 2
            plain = out if plain is None else plain
    finally:
        model.__class__ = base
    assert torch.equal(out, plain)


def test_crop_and_verifys_own_answer_refuses_what_attach_refuses(organism):
    """answer() runs the model itself, beside what is attached: PriorSuppression with the
    caller's spans failed there with a prompt the user never wrote, and a second
    crop-and-verify broke generate() and its detach."""
    from mitigate import PriorSuppression

    model, processor = organism
    images = [q.images[0] for q in _full_view_queries(6, 5)[:1]]
    with attach(model, PriorSuppression(processor.tokenizer, spans=[["i think"]])):
        with pytest.raises(ValueError, match="crop_verify cannot run beside prior_suppression"):
            CropVerify(processor).answer(model, images, ["is there a dog in the image ? answer yes or no ."])
    with attach(model, CropVerify(processor)):
        with pytest.raises(ValueError, match="one crop-and-verify per model"):
            attach(model, CropVerify(processor))
    assert "_mitigation_handles" not in vars(model)
