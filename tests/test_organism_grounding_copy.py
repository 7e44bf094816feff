"""evaluators.organism.grounding_copy: can the decoder copy a box it is handed (issue 3)."""

from __future__ import annotations

import json

import pytest
import torch

from evaluators.organism import ORGANISM_DIR, load_organism, train
from evaluators.organism.grounding_copy import CopyTask, _listing, attention_mass, finetune, main
from evaluators.organism.package import format_prompt

pytestmark = pytest.mark.skipif(not (ORGANISM_DIR / "config.json").exists(), reason="organism checkpoint missing")




def test_text_form_lists_every_object_with_the_box_the_answer_copies(organism):
    task = CopyTask(*organism, "text")
    seeds = list(range(5, 13))
    embeds, mask, labels, examples = task.batch(seeds)
    assert embeds.shape[:2] == mask.shape == labels.shape
    tok = task.tok
    for i, (seed, e) in enumerate(zip(seeds, examples)):
        answer = tok.convert_ids_to_tokens([t for t in labels[i].tolist() if t != -100])
        assert answer[-1] == tok.eos_token and " ".join(answer[:-1]) == e.answer
        listing = _listing(task.world.scene(seed))
        if e.answer == "none":
            assert f" {e.meta['category']} " not in f" {listing} "
        else:  # the named object is listed with exactly the tokens the answer copies
            assert f"{e.meta['category']} {e.answer}" in listing
    assert {e.answer == "none" for e in examples} == {True, False}


def test_listing_only_the_named_object_makes_a_pure_copy(organism):
    task = CopyTask(*organism, "text", listed=1)
    seeds = list(range(20, 32))
    _, _, _, examples = task.batch(seeds)
    for seed, e in zip(seeds, examples):
        listing = _listing(task.world.scene(seed), e.meta["category"], 1)
        assert len(listing.split()) == 6  # one "colour category" and its four box tokens
        if e.answer != "none":
            assert listing.endswith(f"{e.meta['category']} {e.answer}")
    scene = task.world.scene(20)
    assert _listing(scene, None, 0) == _listing(scene) and len(_listing(scene, None, 2).split()) == 12


def _present_image_tokens(task):
    """``(seed, example, image tokens incl. CLS)`` of the first held-in query about a present object."""
    seed = next(s for s in range(11, 40) if task.batch([s])[3][0].answer != "none")
    embeds, _, _, (example,) = task.batch([seed])
    ids = task.processor(text=[f"{format_prompt(example.question)} {task.answer(example)} </s>"],
                         images=example.images, return_tensors="pt")["input_ids"][0]
    return seed, example, embeds[0, ids == task.image_id]


def test_image_codes_replace_the_image_tokens_by_stage_2_targets_with_the_box_code(organism):
    model, processor = organism
    task = CopyTask(model, processor, "image-codes", box_scale=0.5)
    seed, example, image = _present_image_tokens(task)
    scene = task.world.scene(seed)
    owner = train.patch_owners(scene)
    assert torch.count_nonzero(image[0]) == 0  # CLS
    assert torch.count_nonzero(image[1:][torch.from_numpy(owner < 0)]) == 0  # background
    obj = next(o for o in scene.objects if o.category == example.meta["category"])
    patch = int(((owner >= 0) & (owner == scene.objects.index(obj))).nonzero()[0][0])
    code = image[1 + patch] - task.words[obj.category] - task.words[obj.colour]
    assert code.norm() > 0
    best = torch.einsum("d,kbd->kb", code, task.codes).argmax(-1).tolist()
    assert " ".join(f"<c{b}>" for b in best) == example.answer  # the code names the answer's bins


def test_image_codes_with_one_listed_object_code_only_the_named_objects_patches(organism):
    model, processor = organism
    task = CopyTask(model, processor, "image-codes", listed=1)
    seed = next(s for s in range(11, 60)
                if task.batch([s])[3][0].answer != "none" and len(task.world.scene(s).objects) > 1)
    embeds, _, _, (example,) = task.batch([seed])
    ids = processor(text=[f"{format_prompt(example.question)} {example.answer} </s>"], images=example.images,
                    return_tensors="pt")["input_ids"][0]
    image = embeds[0, ids == task.image_id][1:]
    scene = task.world.scene(seed)
    owner = torch.from_numpy(train.patch_owners(scene))
    named = next(i for i, o in enumerate(scene.objects) if o.category == example.meta["category"])
    coded = image.abs().sum(-1) > 0
    assert bool(((owner >= 0) & (owner != named)).any())  # another object's patches, left uncoded
    assert bool(coded[owner == named].all()) and not bool(coded[owner != named].any())


def test_per_edge_answer_tokens_are_the_box_codes_in_the_vocabulary():
    model, processor = load_organism()  # its own copy: the vocabulary grows
    task = CopyTask(model, processor, "image-codes", box_scale=0.5, answer_tokens="per-edge")
    tok = task.tok
    assert model.get_input_embeddings().weight.shape[0] == model.get_output_embeddings().weight.shape[0] == len(tok)
    seed = next(s for s in range(11, 40) if task.batch([s])[3][0].answer != "none")
    embeds, _, labels, (example,) = task.batch([seed])
    answer = tok.convert_ids_to_tokens([t for t in labels[0].tolist() if t != -100])[:-1]
    bins = [t[2:-1] for t in example.answer.split()]
    assert answer == [f"<{e}{b}>" for e, b in zip("ltrb", bins)]  # one token per edge, from its own set
    assert task.shared(" ".join(answer)) == example.answer
    # each answer token's input embedding is its box code over the scale: an object token's
    # box part is box_scale times the embeddings of exactly the tokens the answer writes
    ids = tok.convert_tokens_to_ids(answer)
    weight = model.get_input_embeddings().weight
    for edge, (i, b) in enumerate(zip(ids, bins)):
        assert torch.allclose(weight[i] * 0.5, task.codes[edge][int(b)], atol=1e-6)
    assert torch.count_nonzero(model.get_output_embeddings().weight[ids]) == 0
    scene = task.world.scene(seed)
    owner = train.patch_owners(scene)
    obj = next(o for o in scene.objects if o.category == example.meta["category"])
    patch = int((owner == scene.objects.index(obj)).nonzero()[0][0])
    image = embeds[0, processor(text=[f"{format_prompt(example.question)} {task.answer(example)} </s>"], images=example.images,
                                return_tensors="pt")["input_ids"][0] == task.image_id]
    want = task.words[obj.category] + task.words[obj.colour] + 0.5 * weight[ids].sum(0)
    assert torch.allclose(image[1 + patch], want, atol=1e-5)
    # text form: the listing writes each box in the same per-edge tokens
    assert task.edges("cup <c1> <c2> <c3> <c4> fork <c5> <c6> <c7> <c8>") == \
        "cup <l1> <t2> <r3> <b4> fork <l5> <t6> <r7> <b8>"
    with pytest.raises(ValueError, match="already"):  # twice on one checkpoint: refused
        CopyTask(model, processor, "text", answer_tokens="per-edge")


def test_image_columns_carry_each_patchs_own_column_token(organism):
    model, processor = organism
    task = CopyTask(model, processor, "image-columns", box_scale=1.0)
    seed, example, image = _present_image_tokens(task)
    image = image[1:]  # without CLS
    scene = task.world.scene(seed)
    owner = train.patch_owners(scene)
    weight = model.get_input_embeddings().weight
    columns = set()
    for p in (owner >= 0).nonzero()[0]:
        obj = scene.objects[owner[p]]
        column = task.tok.convert_tokens_to_ids(f"<c{2 * (p % train.GRID)}>")
        want = task.words[obj.category] + task.words[obj.colour] + weight[column]
        assert torch.allclose(image[p], want, atol=1e-6)
        columns.add(p % train.GRID)
    assert len(columns) > 1  # patches of different columns carry different tokens
    assert torch.count_nonzero(image[torch.from_numpy(owner < 0)]) == 0


def test_finetune_reports_per_token_losses_and_held_out_scores(organism):
    model, processor = organism
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        rows = finetune(CopyTask(model, processor, "text"), steps=2, lr=1e-3, batch=4, every=1, log=lambda _: None)
        assert [r["step"] for r in rows] == [1, 2]
        for row in rows:
            assert len(row["box_token_nll"]) == 4 and all(v > 0 for v in row["box_token_nll"])
            assert 0.0 <= row["iou50_rate"] <= 100.0 and len(row["exact_edges"]) == 4
        assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the decoder trained
    finally:
        model.load_state_dict(before)


def test_a_listed_curriculum_moves_through_its_counts(organism):
    model, processor = organism
    before = {k: v.clone() for k, v in model.state_dict().items()}
    task = CopyTask(model, processor, "text", listed=1)
    seen = []
    evaluate = task.evaluate
    task.evaluate = lambda: (seen.append(task.listed), evaluate(n=4))[1]
    try:
        finetune(task, steps=4, lr=1e-3, batch=2, every=1, log=lambda _: None, schedule=(1, 0))
    finally:
        model.load_state_dict(before)
    assert seen == [1, 1, 0, 0]


def test_main_prints_json_rows(capsys):
    main(["--given", "text", "--steps", "1", "--batch", "2", "--threads", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["step"] for r in rows] == [0, 1]


@pytest.mark.parametrize("argv", [["--given", "boxes"], ["--given", "text", "--steps", "0"],
                                  ["--given", "text", "--lr", "0"], ["--given", "image-codes", "--box-scale", "0"],
                                  ["--given", "text", "--listed", "-1"], ["--given", "text", "--listed", "1,x"],
                                  ["--given", "text", "--answer-tokens", "edges"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_bad_form_is_a_value_error(organism):
    with pytest.raises(ValueError, match="given"):
        CopyTask(*organism, "boxes")
    with pytest.raises(ValueError, match="box_scale"):
        CopyTask(*organism, "image-codes", box_scale=0)
    with pytest.raises(ValueError, match="listed"):
        CopyTask(*organism, "text", listed=-1)
    with pytest.raises(ValueError, match="answer_tokens"):
        CopyTask(*organism, "text", answer_tokens="edges")


def test_object_positions_are_the_named_objects_coded_tokens(organism):
    """The attention target of ``--attend-weight``: exactly the image tokens that carry the
    named object's words (its patches), none for an absent object."""
    model, processor = load_organism()
    task = CopyTask(model, processor, "image-codes", box_scale=1.0)
    seeds = list(range(40, 52))
    embeds, _, _, examples = task.batch(seeds)
    objects = task.last_object_positions
    assert {e.answer == "none" for e in examples} == {True, False}
    coded = 0
    for i, e in enumerate(examples):
        if e.answer == "none":
            assert not objects[i].any()
            continue
        if not objects[i].any():  # a small object that covers no patch to 20% is coded nowhere
            continue
        coded += 1
        word = task.words[e.meta["category"]]
        # a named patch's token holds the category word; every other token is some other object's or zero
        named = embeds[i, objects[i]]
        assert len(named) > 0 and all(torch.dot(t, word) > 0.5 * torch.dot(word, word) for t in named)
        others = embeds[i, ~objects[i] & (embeds[i].abs().sum(-1) > 0)]
        image_rows = task.processor(text=[format_prompt(e.question)], images=e.images, return_tensors="pt")
        assert int(objects[i].sum()) < int((image_rows["input_ids"][0] == task.image_id).sum())
        assert not any(torch.allclose(t, n) for t in others for n in named[:1])
    assert coded >= 3


def test_attention_supervision_raises_the_mass_on_the_named_object():
    """A few steps with ``attend_weight`` move the supervised head's attention onto the
    named object (and are refused for the text form)."""
    torch.manual_seed(0)
    model, processor = load_organism()
    task = CopyTask(model, processor, "image-codes", box_scale=1.0)
    model.set_attn_implementation("eager")
    embeds, mask, _, _ = task.batch(list(range(100, 116)), with_answer=True)
    objects = task.last_object_positions
    with torch.no_grad():
        out = model(inputs_embeds=embeds, attention_mask=mask, output_attentions=True)
    before = float(attention_mass(out.attentions, 1, 0, objects)[objects.any(1)].mean())
    rows = finetune(task, steps=30, lr=3e-3, batch=8, every=30, log=lambda m: None, attend_weight=1.0)
    assert rows[-1]["object_attention_mass"] > max(0.1, 3 * before)
    with pytest.raises(ValueError, match="image forms only"):
        finetune(CopyTask(*load_organism(), "text"), steps=1, lr=1e-3, batch=2, every=1, log=print, attend_weight=1.0)
