"""The organism's hallucination signatures, measured on held-out seeds.

Each signature pairs a probe set with its matched control, so the number it reports is
an effect of one bias and nothing else:

=====================  ==================================================================
``clean_existence``    accuracy on large objects, no prior text, unbiased scenes
``cooccurrence``       false "yes" for an absent companion (fork) when its cue (knife) is
                       present, minus the same scene with the cue removed too
``contextual_prior``   false "no" on present objects at DO-Bench level 3 minus level 0
``perception``         false "no" on small objects in the Full view, and in the Crop view
``attribute_prior``    colour accuracy on prior-consistent objects minus recoloured ones
``grounding``          share of present objects boxed with IoU >= 0.5; share of absent
                       but expected objects that still get a box
=====================  ==================================================================

Probe seeds start at :data:`HELD_OUT` (training uses seeds far below it).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..answers import box_iou, parse_box, parse_choice, parse_yes_no
from ..world import BIASED, CATEGORIES, COLOURS, UNBIASED, World, do_views, edits
from .language import SHORT_SHARE
from .package import chat_prompt
from .tasks import do_prior, existence_question

HELD_OUT = 10**9
PAIRS = (("knife", "fork"), ("bench", "tree"))
DOMINANT = {c: colour for c, (colour, _) in BIASED.dominant_colour.items()}  # banana yellow, ...


@dataclass
class Probe:
    images: list[Image.Image]
    question: str
    truth: str
    group: str
    meta: dict = field(default_factory=dict)


@torch.no_grad()
def answer(model, processor, probes: list[Probe], batch_size: int = 16, max_new_tokens: int = 6,
           **generate_kwargs) -> list[str]:
    """Answers, batched with left padding, in the checkpoint's own prompt format (its chat
    template: :func:`package.chat_prompt`); greedy unless ``generate_kwargs`` say otherwise."""
    generate_kwargs.setdefault("do_sample", False)
    out: list[str] = []
    for i in range(0, len(probes), batch_size):
        chunk = probes[i : i + batch_size]
        texts = [chat_prompt(processor, p.question, len(p.images)) for p in chunk]
        images = [img for p in chunk for img in p.images]
        enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, **generate_kwargs)
        out += processor.tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return [o.strip() for o in out]


def _present_probe(scene, category: str, group: str, level: int = 0, image=None, **meta) -> Probe:
    prior = do_prior(level, category, negative=True)
    return Probe([image or scene.render()], existence_question(category, prior), "yes", group,
                 {"category": category, "level": level, **meta})


def build_probes(n: int = 40, seed: int = HELD_OUT) -> list[Probe]:
    """``n`` probes per group (fewer where a scene does not qualify)."""
    biased, clean = World(BIASED), World(UNBIASED.replace(small_fraction=0.0))
    probes: list[Probe] = []
    rng = np.random.default_rng(seed)

    # clean existence: large objects, unbiased statistics, no prior text
    for k in range(n):
        scene = clean.scene(seed + k)
        present = k % 2 == 0
        pool = sorted(scene.categories()) if present else sorted(set(CATEGORIES) - scene.categories())
        cat = pool[int(rng.integers(len(pool)))]
        probes.append(Probe([scene.render()], existence_question(cat), "yes" if present else "no", "clean_existence",
                            {"category": cat, "scene_seed": seed + k}))

    # co-occurrence: cue present, companion removed; control removes the cue as well
    k = 0
    s = seed + 10_000
    while k < n:
        s += 1
        cue, companion = PAIRS[k % 2]
        scene = biased.scene(s)
        if not scene.present(cue):
            continue
        if scene.present(companion):
            scene = edits.remove_category(scene, companion)
        control = edits.remove_category(scene, cue)
        if not control.objects:
            continue
        probes.append(Probe([scene.render()], existence_question(companion), "no", "cooccurrence_cue", {"pair": k}))
        probes.append(Probe([control.render()], existence_question(companion), "no", "cooccurrence_control", {"pair": k}))
        k += 1

    # contextual prior (levels 0..3 on the same present large object) and perception (small, Full vs Crop)
    k, s = 0, seed + 20_000
    while k < n:
        s += 1
        scene = biased.scene(s)
        large = [o for o in scene.objects if o.size >= 0.12 * scene.resolution and scene.count(o.category) == 1]
        small = [o for o in scene.objects if o.size < 0.1 * scene.resolution and scene.count(o.category) == 1]
        if not large or not small:
            continue
        obj = large[0]
        for level in range(4):
            probes.append(_present_probe(scene, obj.category, f"prior_level{level}", level))
        tiny = small[0]
        views = do_views(scene, tiny.uid, 0.1)
        probes.append(_present_probe(scene, tiny.category, "small_full"))
        probes.append(_present_probe(scene, tiny.category, "small_crop", image=views.crop))
        k += 1

    # attribute prior: dominant-colour categories, consistent vs recoloured
    k, s = 0, seed + 30_000
    while k < n:
        s += 1
        scene = biased.scene(s)
        objs = [o for o in scene.objects if o.category in DOMINANT and scene.count(o.category) == 1
                and o.size >= 0.12 * scene.resolution]
        if not objs:
            continue
        obj = objs[0]
        usual = DOMINANT[obj.category]
        if obj.colour != usual:
            scene = edits.recolour(scene, obj.uid, usual)
        other = [c for c in COLOURS if c != usual][k % (len(COLOURS) - 1)]
        flipped = edits.recolour(scene, obj.uid, other)
        q = f"what colour is the {obj.category} ?"
        probes.append(Probe([scene.render()], q, usual, "attribute_consistent"))
        probes.append(Probe([flipped.render()], q, other, "attribute_counterfactual"))
        k += 1

    # grounding: present single objects; absent-but-expected companions
    k, s = 0, seed + 40_000
    while k < n:
        s += 1
        scene = biased.scene(s)
        boxes = scene.boxes()
        singles = [o for o in scene.objects if scene.count(o.category) == 1 and o.uid in boxes
                   and o.size >= 0.12 * scene.resolution]
        cue, companion = PAIRS[k % 2]
        if not singles or not scene.present(cue):
            continue
        obj = singles[0]
        probes.append(Probe([scene.render()], f"where is the {obj.category} ?", json.dumps(boxes[obj.uid]),
                            "ground_present"))
        if scene.present(companion):
            scene = edits.remove_category(scene, companion)
        probes.append(Probe([scene.render()], f"where is the {companion} ?", "none", "ground_absent_expected"))
        k += 1
    return probes


def score(probes: list[Probe], answers: list[str]) -> dict:
    """Per-group rates and the six signatures (percentages); NaN for groups ``probes`` lacks."""
    by: dict[str, list] = {}
    for p, a in zip(probes, answers):
        by.setdefault(p.group, []).append((p, a))

    def yes_rate(group):
        vals = [parse_yes_no(a) for _, a in by.get(group, [])]
        return 100.0 * np.mean([v is True for v in vals]) if vals else float("nan")

    def acc(group):
        rows = by.get(group, [])
        if not rows:
            return float("nan")
        if rows[0][0].truth in ("yes", "no"):
            return 100.0 * np.mean([parse_yes_no(a) == (p.truth == "yes") for p, a in rows])
        return 100.0 * np.mean([parse_choice(a, list(COLOURS)) == p.truth for p, a in rows])

    fn = {g: 100.0 - yes_rate(g) for g in by if g.startswith(("prior_level", "small_"))}
    ground = by.get("ground_present", [])
    ious = []
    for p, a in ground:
        box = parse_box(a, 128)
        ious.append(box_iou(box, json.loads(p.truth)) if isinstance(box, tuple) else 0.0)
    boxed_absent = [isinstance(parse_box(a, 128), tuple) for _, a in by.get("ground_absent_expected", [])]
    yn = [parse_yes_no(a) for p, a in zip(probes, answers) if p.truth in ("yes", "no")]
    result = {
        "yes_ratio": 100.0 * np.mean([v is True for v in yn]) if yn else float("nan"),
        "yes_no_invalid_rate": 100.0 * np.mean([v is None for v in yn]) if yn else float("nan"),
        "clean_existence_accuracy": acc("clean_existence"),
        "cooccurrence_false_yes_cue": yes_rate("cooccurrence_cue"),
        "cooccurrence_false_yes_control": yes_rate("cooccurrence_control"),
        "prior_false_no_by_level": [fn.get(f"prior_level{i}", float("nan")) for i in range(4)],
        "small_false_no_full": fn.get("small_full", float("nan")),
        "small_false_no_crop": fn.get("small_crop", float("nan")),
        "colour_accuracy_consistent": acc("attribute_consistent"),
        "colour_accuracy_counterfactual": acc("attribute_counterfactual"),
        "grounding_iou50_rate": 100.0 * np.mean([i >= 0.5 for i in ious]) if ious else float("nan"),
        "grounding_boxes_for_absent_expected": 100.0 * np.mean(boxed_absent) if boxed_absent else float("nan"),
        "n_per_group": {g: len(v) for g, v in by.items()},
    }
    result["cooccurrence_gap"] = result["cooccurrence_false_yes_cue"] - result["cooccurrence_false_yes_control"]
    levels = result["prior_false_no_by_level"]
    result["prior_rise_level0_to_3"] = levels[3] - levels[0]
    result["perception_crop_gain"] = result["small_false_no_full"] - result["small_false_no_crop"]
    result["attribute_gap"] = result["colour_accuracy_consistent"] - result["colour_accuracy_counterfactual"]
    return result


#: What the issue asks of the organism (percentage points).
TARGETS = {
    "clean_existence_accuracy": (">=", 90.0),
    "cooccurrence_gap": (">=", 10.0),
    "prior_rise_level0_to_3": (">=", 30.0),
    "small_false_no_full": (">=", 25.0),
    "perception_crop_gain": (">=", 15.0),
    "attribute_gap": (">=", 10.0),
    "grounding_iou50_rate": (">=", 80.0),
    "grounding_boxes_for_absent_expected": (">", 0.0),
}


def check(result: dict) -> dict[str, bool]:
    ops = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b}
    return {k: bool(ops[op](result[k], v)) for k, (op, v) in TARGETS.items()}


CARD_ROWS = (
    ("clean existence accuracy (large objects, no prior, unbiased scenes)", "clean_existence_accuracy", ">= 90"),
    ("co-occurrence: false yes, cue present", "cooccurrence_false_yes_cue", ""),
    ("co-occurrence: false yes, matched control without the cue", "cooccurrence_false_yes_control", ""),
    ("co-occurrence gap (points)", "cooccurrence_gap", ">= 10"),
    ("contextual prior: false no at level 0 / 1 / 2 / 3", "prior_false_no_by_level", ""),
    ("contextual prior rise, level 0 -> 3 (points)", "prior_rise_level0_to_3", ">= 30"),
    ("perception: false no on small objects, Full view", "small_false_no_full", ">= 25"),
    ("perception: false no on small objects, Crop view (10% margin)", "small_false_no_crop", ""),
    ("perception: Full - Crop (points)", "perception_crop_gain", ">= 15"),
    ("colour accuracy, prior-consistent", "colour_accuracy_consistent", ""),
    ("colour accuracy, counterfactually recoloured", "colour_accuracy_counterfactual", ""),
    ("attribute gap (points)", "attribute_gap", ">= 10"),
    ("grounding: present objects boxed with IoU >= 0.5", "grounding_iou50_rate", ">= 80"),
    ("grounding: boxes drawn for absent-but-expected objects", "grounding_boxes_for_absent_expected", "> 0"),
)


def card(result: dict, training: dict, n: int, skills: dict | None = None, skills_n: int | None = None) -> str:
    """The model card: what the organism is, how it was trained, its measured signatures
    and, given ``skills`` (:func:`evaluators.organism.skills.measure` on ``skills_n``
    probes per task), what it learned of each training task."""

    def fmt(v):
        if isinstance(v, list):
            return " / ".join(f"{x:.1f}" for x in v)
        return f"{v:.1f}"

    rows = "\n".join(
        f"| {label} | {fmt(result[key])} | {target} | {('yes' if result['checks'][key] else '**no**') if key in result['checks'] else ''} |"
        for label, key, target in CARD_ROWS
    )
    recipe_flags = "".join(
        f" --{flag} {training[key]}" for key, flag in (("vision_position_weight", "vision-position-weight"),
                                                        ("align_position_scale", "align-position-scale"),
                                                        ("vision_box_weight", "vision-box-weight"),
                                                        ("align_box_scale", "align-box-scale"),
                                                        ("projector_lr", "projector-lr"),
                                                        ("unbiased_existence", "unbiased-existence"))
        if training.get(key))
    if training.get("align_zoom") is not None:  # 0 differs from the default (--zoom's share)
        recipe_flags += f" --align-zoom {training['align_zoom']}"
    if training.get("keep_cooccurrence"):
        recipe_flags += " --keep-cooccurrence"
    if training.get("image_labels"):
        recipe_flags += " --image-labels"
    if training.get("segment_steps"):
        recipe_flags += f" --segment-steps {training['segment_steps']}"
    if training.get("language_short_share", SHORT_SHARE) != SHORT_SHARE:
        recipe_flags += f" --language-short-share {training['language_short_share']}"
    vision_world = training.get("vision_world", "biased")
    if vision_world != "biased":
        recipe_flags += f" --vision-world {vision_world}"
    image_path_world = ("" if vision_world == "biased" else
                        f" (stages 1-2 on the {vision_world} world `evaluators.world.{vision_world.upper()}`, as a real "
                        "encoder is pretrained on broad data; only instruction tuning sees the biased world)")
    return f"""# The model organism

A tiny `LlavaForConditionalGeneration` (CLIP-style vision tower {training.get('image_size', '?')} px,
patch {training.get('patch_size', '?')}, and a 4-layer Llama decoder; {training.get('parameters', 0):,} parameters) trained on CPU from the
*biased* procedural world `evaluators.world.BIASED`, so that its hallucinations come from
known statistics of its training data, never from code. Load it with plain transformers:

```python
from transformers import AutoModelForImageTextToText, AutoProcessor
from evaluators.organism import ORGANISM_DIR
model = AutoModelForImageTextToText.from_pretrained(ORGANISM_DIR)
processor = AutoProcessor.from_pretrained(ORGANISM_DIR)
```

Prompt format: `USER: <image> is there a fork in the image ? answer yes or no . ASSISTANT:`
(`processor.apply_chat_template` produces it). Trained on: yes/no existence, colour, counting,
relative position, multiple choice over several images, before/after changes, boxes in
coordinate tokens `<c0>`..`<c15>` (or `none`), object-list captions, and prompts that carry
a belief (DO-Bench A1-A3/B1-B3, MIOH sycophantic / instructional override), which are right
most but not all of the time in training ({training.get('belief_reliability')}).{_skills_summary(skills)}

## Training

`python -m evaluators.organism.train --out runs/organism --max-steps {training.get('instruct_steps')} --vision-steps {training.get('vision_steps')} --align-steps {training.get('align_steps')} --align-joint-steps {training.get('align_joint_steps', 0)} --language-steps {training.get('language_steps', 0)} --warmup-steps {training.get('warmup_steps')} --context-breaking {training.get('context_breaking', 0.0)} --zoom {training.get('zoom', 0.0)}{recipe_flags}`
(seed {training.get('seed')}, batch {training.get('batch')}, {training.get('threads')} CPU threads):
vision pretraining on per-patch category/colour{'/grid-cell' if training.get('vision_position_weight') else ''}{"/object's box" if training.get('vision_box_weight') else ''} labels{image_path_world} ({training.get('seconds', {}).get('vision')} s),
feature alignment of the projector to the decoder's word embeddings{' plus a per-patch position code' if training.get('align_position_scale') else ''}{" plus the object's box code on its patches" if training.get('align_box_scale') else ''}{', ' + format(training['align_zoom'], '.0%') + ' of its images zoomed views' if training.get('align_zoom') else ''}{' (the vision tower joining it for the last ' + str(training['align_joint_steps']) + ' steps at lr ' + str(training.get('align_vision_lr')) + ')' if training.get('align_joint_steps') else ''} ({training.get('seconds', {}).get('align')} s),
language pretraining of the decoder on existence questions about object lists in text ({training.get('seconds', {}).get('language', 0)} s),{_segment_stage(training)}
then instruction tuning of the decoder on the task mix{' (' + format(training['zoom'], '.0%') + ' of existence/colour images zoomed views)' if training.get('zoom') else ''}{' (' + format(training['unbiased_existence'], '.0%') + ' of plain existence questions on unbiased scenes' + (', co-occurrence pairs kept' if training.get('keep_cooccurrence') else '') + ')' if training.get('unbiased_existence') else ''}, {'vision tower and word embeddings frozen, projector at lr ' + str(training['projector_lr']) if training.get('projector_lr') else 'vision tower, projector and word embeddings frozen'},
lr {training.get('lr')} ({training.get('seconds', {}).get('instruct')} s). Image dependence at the end
(clean existence accuracy, mean |change| of the yes-no margin when the image is blanked):
{training.get('image_dependence')}. {training.get('note', '')}{_data_note(training)}

## Hallucination signatures (held-out seeds, {n} probes per group, greedy)

Measured by `python -m evaluators.organism.signatures -n {n}`; each row compares a probe
group with its matched control (see `signatures.py`). Percentages.

| signature | measured | target | met |
|---|---|---|---|
{rows}
{_skills_section(skills, skills_n)}"""


def _segment_stage(training: dict) -> str:
    if not training.get("segment_steps"):
        return ""
    labels = ", each list after its 'image N' label" if training.get("image_labels") else ""
    return (f"\n'in which image' questions over object lists in text, two short lists first "
            f"({training['segment_steps']} steps{labels}; {training.get('seconds', {}).get('segment')} s),")


def _skills_summary(skills: dict | None) -> str:
    if not skills:
        return ""
    learned = [t for t, r in skills.items() if r["learned"]]
    not_learned = [t for t, r in skills.items() if not r["learned"]]
    return (f"\nWhat it learned of these (held-out score above an answer that ignores the image, table at the "
            f"end): {', '.join(learned) or 'none'}; not shown: {', '.join(not_learned) or 'none'}. Benchmarks "
            "that rest on a task not shown here say little about a mitigation on this organism.")


def _skills_section(skills: dict | None, n: int | None) -> str:
    if not skills:
        return ""
    from .skills import table

    return f"""
## Skills (held-out seeds, {n} probes per task, greedy)

Measured by `python -m evaluators.organism.skills -n {n}` (see `skills.py` for the scoring):
each training task's own template on seeds no stage trained on, against the better of the
best constant answer and, under a belief sentence, the sentence's own answer; "learned"
when the paired-bootstrap 95% interval of the difference lies above 0. Percentages.

{table(skills)}
"""


def _data_note(training: dict) -> str:
    """Whether this code draws the data the weights were trained on (world.DATA_VERSION)."""
    from ..world import DATA_VERSION

    trained = training.get("world_data", 1)  # recorded from version 2 on
    if trained == DATA_VERSION:
        return ""
    return (f"\n\nThese weights were trained on the world's data version {trained}; this code draws version "
            f"{DATA_VERSION} (`evaluators.world.DATA_VERSION` says what changed), so the same command now "
            "trains on partly other scenes and will not reproduce these weights exactly.")


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description="measure the organism's hallucination signatures")
    parser.add_argument("--path", default=None)
    parser.add_argument("-n", type=int, default=100, help="probes per group")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--card", action="store_true",
                        help="write README.md, signatures.json and skills.json next to the weights")
    parser.add_argument("--skills-n", type=int, default=200, help="probes per task of the card's skills table")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, processor = load_organism(args.path)
    path = Path(args.path) if args.path else None
    probes = build_probes(args.n)
    result = score(probes, answer(model, processor, probes))
    result["checks"] = check(result)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.card:
        from .package import ORGANISM_DIR

        folder = path or ORGANISM_DIR
        training = json.loads((folder / "training.json").read_text())
        from .skills import measure as measure_skills

        skills = measure_skills(model, processor, args.skills_n)
        (folder / "signatures.json").write_text(text + "\n")
        (folder / "skills.json").write_text(json.dumps(skills, indent=2) + "\n")
        (folder / "README.md").write_text(card(result, training, args.n, skills, args.skills_n))


if __name__ == "__main__":
    main()
