"""Non-LLaVA families end to end, as a user's checkpoint folder: a tiny random model saved
with its family's own processor (hooks.testing.processors), loaded by path through
``AutoProcessor`` / ``AutoModelForImageTextToText``, run by the evaluators and the report."""

from __future__ import annotations

import json

import pytest

from evaluators.benchmarks.suites import build_queries
from evaluators.model import HFModel, load_hf
from hooks import resolve
from hooks.testing.processors import PROCESSOR_SPECS, TINY_PROCESSOR_TYPES, save_tiny_checkpoint
from mitigate import PriorSuppression


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One folder per family; the tokenizers know the organism's words (the suites' words)."""
    from evaluators.organism import ORGANISM_DIR

    vocab = json.loads((ORGANISM_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    words = [w for w in vocab if not w.startswith("<")]
    root = tmp_path_factory.mktemp("tiny_checkpoints")
    return {t: str(save_tiny_checkpoint(t, root / t, words=words)) for t in TINY_PROCESSOR_TYPES}


@pytest.mark.parametrize("model_type", TINY_PROCESSOR_TYPES)
def test_a_saved_checkpoint_answers_a_batch(checkpoints, model_type):
    """Loaded by path, the family's processor and model answer a batch of DO-Bench queries
    of different image sizes (a flat image list breaks Gemma3's processor beyond batch 1)."""
    model, processor = load_hf(checkpoints[model_type])
    assert model.config.model_type == model_type
    assert type(processor).__name__ == PROCESSOR_SPECS[model_type]["class"]
    queries = [q for q in build_queries(["dobench"], scale="small") if q.record["view"] in ("Full", "Crop")][:3]
    answers = HFModel(model, processor, max_new_tokens=3)(queries)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)


@pytest.mark.parametrize("model_type", TINY_PROCESSOR_TYPES)
def test_a_prompt_already_templated_is_named_not_templated_twice(checkpoints, model_type):
    """user_prompt on its own output (what a caller passing apply_chat_template's text to
    CropVerify.answer does) names the mistake, on each family's own processor."""
    from hooks.prompting import user_prompt

    _, processor = load_hf(checkpoints[model_type])
    once = user_prompt(processor, "is there a dog ?")
    with pytest.raises(ValueError, match="already holds the image placeholder"):
        user_prompt(processor, once)


@pytest.mark.parametrize("model_type", TINY_PROCESSOR_TYPES)
def test_beliefs_are_found_in_the_familys_own_template(checkpoints, model_type):
    """Context mode finds DO-Bench's belief sentence in the templated prompt, whatever the
    template puts before the image: the tiny tokenizers drop the template's newlines, so
    without the image as a sentence break Gemma3's "user" (before the image) ran into the
    belief (after it) and the span overlapped the image tokens."""
    model, processor = load_hf(checkpoints[model_type])
    query = next(q for q in build_queries(["dobench"], scale="small") if q.record["level"] == 1)
    enc = processor(text=[HFModel(model, processor).prompt(query)], images=[query.load_images()], return_tensors="pt")
    mitigation = PriorSuppression(processor.tokenizer)
    mask = mitigation.span_mask(resolve(model), enc["input_ids"])
    (span,) = mitigation.found[0]
    assert span.text == query.prompt[: query.prompt.index(".") + 1]  # the level-1 sentence, nothing else
    assert processor.tokenizer.decode(enc["input_ids"][0][mask[0]]).split() == span.text.split()


def test_vlm_report_on_a_gemma3_checkpoint(checkpoints, tmp_path):
    """``vlm-report --model <folder>`` on a Gemma3 checkpoint runs every default arm (VCD,
    both prior modes, compaction under a sliding window, crop-and-verify, all combined)."""
    from evaluators.report.attribution import default_arms
    from evaluators.report.main import main

    out = tmp_path / "report"
    assert main(["--model", checkpoints["gemma3"], "--tasks", "dobench,mioh", "--resamples", "100",
                 "--no_progress", "--batch_size", "8", "--output_path", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["scores"]) == {a.name for a in default_arms()}
    assert all(set(scores) == {"dobench", "mioh"} for scores in result["scores"].values())
    verification = result["cost"]["crop-and-verify"]["verification"]
    assert verification["queries"] > 0 and verification["not_applicable"] > 0  # MIOH's multi-image queries


@pytest.mark.parametrize("model_type", TINY_PROCESSOR_TYPES)
def test_pipeline_with_every_mitigation_and_exact_removal(checkpoints, model_type):
    """pipeline("image-text-to-text") over a saved checkpoint runs with VCD, both prior
    modes (compacted) and crop-and-verify attached together, and answers exactly as before
    once they are detached."""
    from transformers import pipeline

    from evaluators.world import BIASED, World
    from mitigate import VCD, CropVerify, attach

    model, processor = load_hf(checkpoints[model_type])
    pipe = pipeline("image-text-to-text", model=model, processor=processor)
    image = World(BIASED).scene(3).render()
    question = "i am certain there is no dog in the image . is there a dog in the image ?"
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}]

    def ask():
        if processor.chat_template is None:  # PaliGemma: no chat, the pipeline takes the text as it is
            answer = pipe(images=image, text=question, generate_kwargs={"max_new_tokens": 4, "do_sample": False})
            return {"role": "assistant", "content": answer[0]["generated_text"]}
        return pipe(text=messages, generate_kwargs={"max_new_tokens": 4, "do_sample": False})[0]["generated_text"][-1]

    before = ask()
    prior = PriorSuppression(processor.tokenizer, mode="both", compact_positions=True)
    with attach(model, prior):  # alone, its last prompt is the pipeline's (not a view's)
        ask()
    assert [s.text for s in prior.found[0]] == ["i am certain there is no dog in the image ."]
    with attach(model, VCD(), prior, CropVerify(processor)):
        mitigated = ask()
    assert mitigated["role"] == "assistant" and isinstance(mitigated["content"], str)
    assert ask() == before


def test_a_checkpoint_without_a_chat_template_is_prompted_and_mitigated(checkpoints):
    """PaliGemma ships no chat template: the prompt is its image placeholder, then the text
    (hooks.prompting), which its processor completes with BOS and the newline. Its processor
    returns all -100 labels with every call: contrast branches drop them, and refuse labels
    that hold a target."""
    import torch

    from evaluators.world import BIASED, World
    from hooks.prompting import user_prompt
    from mitigate import VCD, attach

    model, processor = load_hf(checkpoints["paligemma"])
    assert processor.chat_template is None
    prompt = user_prompt(processor, "is there a dog ?")
    assert prompt == processor.image_token + "is there a dog ?"
    enc = processor(text=[prompt], images=[[World(BIASED).scene(3).render()]], return_tensors="pt")
    assert (enc["input_ids"] == model.config.image_token_id).sum() == model.config.text_config.num_image_tokens
    assert (enc["labels"] == -100).all()
    plain = {k: v for k, v in enc.items() if k != "labels"}
    with attach(model, VCD(seed=0)), torch.no_grad():  # a forward of the caller's own inputs, as
        # crop-and-verify's localisation pass makes one (generate() itself does not pass labels on)
        with_labels = model(**enc).logits
        without = model(**plain).logits
        target = enc["labels"].clone()
        target[0, -1] = 5
        with pytest.raises(ValueError, match="do not pass labels"):
            model(**{**plain, "labels": target})
    assert torch.equal(with_labels, without)

    class Bare:  # no template and no image placeholder: nothing says where the image goes
        chat_template = None

    # any processor but PaliGemma's is warned about, once: it lost a template its checkpoint had
    with pytest.warns(UserWarning, match="Bare has no chat template"), \
            pytest.raises(ValueError, match="no chat template and no image_token"):
        user_prompt(Bare(), "is there a dog ?")
    assert user_prompt(Bare(), "a text-only prompt", n_images=0) == "a text-only prompt"
