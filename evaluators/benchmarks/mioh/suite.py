"""MIOH's conditions (Sec. 4.3) on image sets of the counterfactual world.

Every image set is asked two of MIOH's existence question types (Sec. 3.1):

* *selective*: "In which image is there a X?" with the options Image 1 .. Image N and "None
  of the above" (App. Fig. I-II), which the organism was trained on;
* *comprehensive*: is the target in any of the images -- the form of Sec. 5.5 ("Is there an
  OBJECT in any of these IMAGES?"), asked yes / no in the organism's words
  (:data:`COMPREHENSIVE`). App. Fig. I gives it the options "Yes, all of them" / "Yes, in
  some of them" / "No, in none of them" / "I don't know"; a world set holds the target in
  one image or none, so "all" never applies past one image and "yes" is exactly "some", "no"
  exactly "none". The yes / no form drops only "I don't know". The organism never saw this
  question in training: it reads it with its single-image existence skill over several
  images' tokens.

under every condition:

* ``easy``: 4 images, the target large in one of them (or in none), every image of the
  target's unusual context and without its co-occurrence cue, the holder included (since
  session 33: before, only the holder could be of the usual context or hold the cue, and
  picking that image scored 61-69% blind against 25% for "none");
* ``HP`` (hard positives): the target present but small;
* ``HN`` (hard negatives): every image of the target's usual context with its
  co-occurrence cue in it, the target large in one of them in the sets where ``easy``'s
  is (three of four) and in none in the others. Up to session 31 the target was in none of
  them, so "none of the above" was right for every hard negative; Sec. 4.3 puts "0 to N"
  hard-negative images in a question of N, so the others may hold the target (its
  existence example, App. Fig. I, is an all-negative set). HN against ``easy`` is a matched
  pair: the same share of sets holding a large target, with the context and cue in every
  image or in none;
* ``NI``: easy sets of 2, 4, 8 and 10 images (more images, more context);
* ``LC-S`` / ``LC-I``: easy sets with a sycophantic or an instructional-override sentence
  before the question that contradicts the images (MIOH's two linguistic pressures).

Records carry ``task``, ``qtype``, ``condition``, ``n_images`` for :mod:`.metrics`.
The per-image questions of an NI set are combined for both of its questions
(:func:`assemble`): into the one image answered "yes" among the images the selective
question lists for the selective question (our extension of Sec. 5.5; at 8 and 10 images
it lists four, and until session 32 the combination read all of them, so a "yes" on an
unlisted image made the decomposed answer wrong where the direct question could not pick
it), and into "present in any image" for the comprehensive one (Sec. 5.5's own comparison).

The comprehensive questions were added in session 25 without moving the selective ones:
each set is still drawn from the count of selective and per-image questions before it, so
the selective questions, their ids and images are those of earlier versions.
"""

from __future__ import annotations

import numpy as np

from ...benchmarks.mioh.metrics import combine_existence, combine_selective
from ...organism.tasks import OPTION_LETTERS, existence_question, mioh_context
from ...query import Query
from ...world import BIASED, World, check_count, check_seed, derive_seed, image_set

TARGETS = ("fork", "tree")  # the world's co-occurrence companions: HN needs a cue for them
ALL_TARGETS = ("cup", "plate", "fork", "knife", "banana", "tree", "dog", "ball", "bench", "bird")


#: MIOH's comprehensive existence question (Sec. 5.5) in the organism's vocabulary, which has
#: no "any" or "these": "is there a X in the images ? answer yes or no ." after the images.
COMPREHENSIVE = "is there a {target} in the images ? answer yes or no ."


def comprehensive_question(target: str, context: str = "") -> str:
    """The comprehensive existence question about ``target``, ``context`` (a linguistic
    pressure sentence) before it."""
    q = COMPREHENSIVE.format(target=target)
    return f"{context} {q}" if context else q


def _question(target: str, shown: list[int], context: str = "") -> tuple[str, list[str]]:
    """Options "image i" for the shown image indices (at most four, in order) + "none of the above".

    With more than four images, four candidates are listed (the holder among them) so the
    option letters stay a-e, as in the organism's training data and MIOH's examples.
    """
    options = [f"image {i + 1}" for i in shown] + ["none of the above"]
    text = " ".join(f"{OPTION_LETTERS[i]} ) {o}" for i, o in enumerate(options))
    q = f"in which image is there a {target} ? {text}"
    return (f"{context} {q}" if context else q), options


def build(n_per_condition: int = 12, seed: int = 0, world: World | None = None,
          comprehensive: bool = True) -> list[Query]:
    """The suite's queries: per condition ``n_per_condition`` image sets, each asked the
    selective question and (``comprehensive``) the comprehensive one; NI sets also one
    yes / no question per image."""
    seed = check_seed(seed)
    check_count(n_per_condition, "n_per_condition")
    if not isinstance(comprehensive, bool):
        raise ValueError(f"comprehensive must be True or False, got {comprehensive!r}")
    world = world or World(BIASED)
    rng = np.random.default_rng([seed, 41])
    queries: list[Query] = []

    drawn = 0  # selective and per-image questions so far: what each set's seed counts (see above)

    def add(cond: str, n_images: int, target: str, present: bool, k: int, kind: str = "easy", context: str = ""):
        nonlocal drawn
        s = image_set(world, derive_seed(seed, 41, drawn), n_images, target, kind,
                      present=present, holder_unusual=kind == "easy", swap_in=True)
        others = [i for i in range(n_images) if i != s.answer_index]
        size = min(4, n_images) - (s.answer_index is not None)
        if kind == "hard_negative":
            # the draw an HN set made up to session 31 (no holder), so that every set after it
            # is the one of earlier versions; the images shown come from the set's own stream
            rng.choice(list(range(n_images)), size=min(4, n_images), replace=False)
            pick = list(np.random.default_rng([seed, 41, drawn]).choice(others, size=size, replace=False))
        else:
            pick = list(rng.choice(others, size=size, replace=False))
        shown = sorted(pick + ([s.answer_index] if s.answer_index is not None else []))
        prompt, options = _question(target, [int(i) for i in shown], context)
        truth = OPTION_LETTERS[shown.index(s.answer_index)] if s.answer_index is not None else OPTION_LETTERS[len(shown)]
        qid = f"mioh-{seed}-{cond}-{n_images}-{k}"
        images = [sc.render() for sc in s.scenes]
        record = {"task": "existence", "qtype": "selective", "condition": cond, "n_images": n_images,
                  "target": target, "present": present, "set_id": qid}  # set_id: --limit keeps a set whole
        queries.append(Query(qid, "mioh", images, prompt, "option", truth, record, options=options))
        drawn += 1
        if cond == "NI":  # §5.5: the same question decomposed into one yes/no per image
            for i, image in enumerate(images):
                queries.append(Query(f"{qid}-image{i}", "mioh", [image], existence_question(target), "yes_no",
                                     "yes" if i == s.answer_index else "no",
                                     {**record, "decomposed_of": qid, "image_index": i, "holder": s.answer_index,
                                      "listed": [int(j) for j in shown]}))
            drawn += len(images)
        if comprehensive:
            holds = s.answer_index is not None
            queries.append(Query(f"{qid}-comprehensive", "mioh", images, comprehensive_question(target, context),
                                 "yes_no", "yes" if holds else "no",
                                 {**record, "qtype": "comprehensive", "option": "some" if holds else "none"}))

    for k in range(n_per_condition):
        target = ALL_TARGETS[int(rng.integers(len(ALL_TARGETS)))]
        add("easy", 4, target, present=k % 4 != 3, k=k)
        add("HP", 4, target, present=True, k=k, kind="hard_positive")
        # present in the sets where easy's is; the target alternates so that each is absent in
        # some sets from 8 sets per condition up (at 4, the small scale, one set has none: tree's)
        add("HN", 4, TARGETS[(k + k // 4) % 2], present=k % 4 != 3, k=k, kind="hard_negative")
        for n in (2, 4, 8, 10):
            add("NI", n, target, present=k % 4 != 3, k=k)
        present = k % 2 == 0  # the pressure contradicts the images
        add("LC-S", 4, target, present=present, k=k,
            context=mioh_context("sycophantic", target, negative=present))
        add("LC-I", 4, target, present=present, k=k,
            context=mioh_context("instructional", target, negative=present))
    return queries


def assemble(rows: list[dict]) -> list[dict]:
    """Per-query lines -> metric records: the per-image answers of each NI set are combined
    into one ``decomposed`` record per question type -- the selective answer
    (:func:`combine_selective`) and the comprehensive one, "yes" when any image is answered
    "yes" (§5.5: "combining the answers to determine overall presence"; with
    :func:`combine_existence`, "all" or "some")."""
    out = [r for r in rows if "decomposed_of" not in r and not r.get("invalid_input")]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if "decomposed_of" in r:
            groups.setdefault(r["decomposed_of"], []).append(r)
    for qid, parts in sorted(groups.items()):
        parts.sort(key=lambda r: r["image_index"])
        if len(parts) != parts[0]["n_images"]:
            continue  # scored once every image of the question is answered
        if any(p.get("invalid_input") for p in parts):
            continue  # an image that could not be read: left out, as the direct question over it is
        answers = [p.get("pred_yes") for p in parts]
        # the selective question lists four of 8 or 10 images: its decomposition combines the
        # answers of those images only, so both forms ask the same question (§5.5: "identical
        # visual content"); the comprehensive one asks about every image
        listed = parts[0].get("listed")
        listed = list(range(len(parts))) if listed is None else [int(j) for j in listed]
        combined = combine_selective([answers[j] for j in listed])
        combined = listed[combined] if isinstance(combined, int) else combined
        holder = parts[0]["holder"]
        truth = "none" if holder is None else holder
        keep = {k: parts[0][k] for k in ("task", "qtype", "condition", "n_images", "target", "benchmark")}
        out.append({**keep, "id": qid + "-decomposed", "decomposed": True, "per_image": answers,
                    "combined": combined, "invalid": combined is None, "correct": combined == truth})
        option = combine_existence(answers)  # "all" / "some" / "none", None when unreadable
        present = None if option is None else option != "none"
        # the same per-image answers as the selective record: an unreadable one is counted
        # invalid there once, not twice (it is wrong here all the same)
        out.append({**keep, "qtype": "comprehensive", "id": qid + "-comprehensive-decomposed", "decomposed": True,
                    "per_image": answers, "combined": option, "unreadable": option is None,
                    "correct": present is not None and present == (holder is not None)})
    return out
