"""Can the organism's decoder learn to copy a box it is handed? (issue 3, the grounding target)

    python -m evaluators.organism.grounding_copy --given text --steps 400
    python -m evaluators.organism.grounding_copy --given image-codes --steps 400

Every organism so far answers grounding queries ("where is the cup ?" -> ``<c3> <c5> <c9>
<c12>``, or "none") with 0% of boxes at IoU >= 0.5, even v18, whose image tokens carry
their object's box code (``docs/results/organism_grounding.md``). This asks whether the
decoder could use the box if it were handed over exactly, in two forms, so that neither the
vision tower nor the projector's alignment error is in the way:

* ``text``: the prompt lists the scene's objects, each followed by its box in the answer's
  own tokens (``red cup <c3> <c5> <c9> <c12> blue fork <c1> ...``), and the answer is a
  copy of the four tokens after the named object -- what an LLM's induction heads do;
* ``image-codes``: the image tokens are replaced by stage 2's targets, exactly
  (``emb(category) + emb(colour)`` plus :func:`train.box_codes` of the object's box bins
  on object patches, zero elsewhere; ``--box-scale`` as ``train --align-box-scale``);
* ``image-columns``: as ``image-codes``, but each object patch carries, instead of its
  object's box, its *own column*: ``--box-scale`` times the input embedding of the
  coordinate token of the patch's left edge (``<c{2 * column}>``). Nothing carries the row:
  image tokens come row by row, so the sequence position says it. An object's first and
  last patches in that order are its top-left and bottom-right ones, so a box is two
  copies of one token each, if the decoder finds those patches.

``--listed N`` lists only N objects, the named one among them (in the image-codes form the
others' tokens are zero, as background): ``--listed 1`` is a pure copy with nothing to find, and ``--listed 1,2,3,0`` a curriculum from one object
to whole scenes, each count for an equal share of the steps.

It fine-tunes a copy of a checkpoint's decoder on ``tasks.grounding`` questions only (batch
32, AdamW at ``--lr`` after a 50-step warm-up, word embeddings, vision tower and projector
frozen, as in stage 3) and prints, every ``--every`` steps, the teacher-forced loss of each
box token (x0, y0, x1, y1; chance is ln 16 = 2.77 nats) and, on held-out scenes (seeds from
10^8), the share of greedy boxes at IoU >= 0.5 and of exact edges. The weights are not saved.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time

import numpy as np
import torch

from evaluators.answers import box_iou, parse_box
from evaluators.world import CATEGORIES, COLOURS, UNBIASED, World

from . import tasks, train
from .language import train_decoder_only
from .package import IMAGE_TOKEN, format_prompt

GIVEN = ("text", "image-codes", "image-columns")
BOX_TOKENS = 4
#: How the answer writes a box: the organism's ``<c3> <c5> <c9> <c12>`` (one set of 16
#: coordinate tokens shared by the four edges), or ``per-edge``: a set per edge, ``<l3>
#: <t5> <r9> <b12>`` (left, top, right, bottom), added to the vocabulary here.
ANSWER_TOKENS = ("shared", "per-edge")
EDGE_PREFIX = ("l", "t", "r", "b")


class CopyTask:
    """Grounding examples whose box is handed to the model in the form ``given``."""

    def __init__(self, model, processor, given: str, box_scale: float = 0.5, seed: int = 0, listed: int = 0,
                 answer_tokens: str = "shared") -> None:
        if given not in GIVEN:
            raise ValueError(f"given must be one of {GIVEN}, got {given!r}")
        if answer_tokens not in ANSWER_TOKENS:
            raise ValueError(f"answer_tokens must be one of {ANSWER_TOKENS}, got {answer_tokens!r}")
        if not box_scale > 0:
            raise ValueError(f"box_scale must be > 0, got {box_scale!r}")
        if listed < 0:
            raise ValueError(f"listed must be >= 0 (0: every object), got {listed!r}")
        self.model, self.processor, self.given, self.listed = model, processor, given, listed
        self.tok = processor.tokenizer
        self.embed = model.get_input_embeddings()
        self.device = self.embed.weight.device
        emb = self.embed.weight.detach().cpu()  # the codes are built on the host, each batch moved over
        names = [*CATEGORIES, *COLOURS]
        self.words = dict(zip(names, emb[self.tok.convert_tokens_to_ids(names)]))
        self.codes = train.box_codes(emb.shape[1], box_scale * float(emb.norm(dim=1).median()), seed)
        self.image_id = self.tok.convert_tokens_to_ids(IMAGE_TOKEN)
        self.world = World(UNBIASED)
        # image-columns: per patch column, box_scale x the embedding of its left edge's coordinate token
        self.columns = box_scale * emb[self.tok.convert_tokens_to_ids(
            [f"<c{c * tasks.COORD_BINS // train.GRID}>" for c in range(train.GRID)])]
        self.per_edge = answer_tokens == "per-edge"
        if self.per_edge:
            self._add_edge_tokens(box_scale)

    def _add_edge_tokens(self, box_scale: float) -> None:
        """Add the per-edge coordinate tokens. Each one's input embedding is its box code
        divided by the scale, so an image token's box code is ``box_scale`` times the
        embeddings of its box's four answer tokens -- the same directions as the shared
        form, only the output vocabulary differs. Their output rows start at zero."""
        names = [f"<{e}{k}>" for e in EDGE_PREFIX for k in range(tasks.COORD_BINS)]
        self.tok.add_tokens(names)
        old = self.embed.weight.shape[0]
        self.model.resize_token_embeddings(len(self.tok), mean_resizing=False)
        self.embed = self.model.get_input_embeddings()
        with torch.no_grad():
            ids = self.tok.convert_tokens_to_ids(names)
            if min(ids) < old:
                raise ValueError("the per-edge tokens are already in this checkpoint's vocabulary")
            self.embed.weight[ids] = (self.codes.reshape(-1, self.codes.shape[-1]) / box_scale).to(self.embed.weight)
            self.model.get_output_embeddings().weight[ids] = 0.0

    def edges(self, text: str) -> str:
        """``text``'s boxes in this task's box tokens: with per-edge tokens, the i-th ``<cN>``
        becomes the (i mod 4)-th edge's (boxes are written as four consecutive tokens)."""
        if not self.per_edge:
            return text
        count = itertools.count()
        return re.sub(r"<c(\d+)>", lambda m: f"<{EDGE_PREFIX[next(count) % BOX_TOKENS]}{m.group(1)}>", text)

    def answer(self, example) -> str:
        """The example's answer in this task's box tokens."""
        return self.edges(example.answer)

    @staticmethod
    def shared(text: str) -> str:
        """A per-edge answer written back in shared tokens (``<l3>`` -> ``<c3>``), for scoring."""
        return re.sub(r"<[ltrb](\d+)>", r"<c\1>", text)

    def _image_tokens(self, scene, named: str) -> torch.Tensor:
        """Stage 2's target for every image token of ``scene`` (CLS first, zero); with
        ``self.listed``, the patches of objects :func:`_listed` leaves out are zero too."""
        owner = train.patch_owners(scene)
        boxes = train.patch_boxes(scene, owner=owner)
        shown = {o.uid for o in _listed(scene, named, self.listed)} if self.listed else None
        tokens = torch.zeros(1 + len(owner), self.codes.shape[-1])
        for p in np.nonzero(owner >= 0)[0]:
            obj = scene.objects[owner[p]]
            if shown is not None and obj.uid not in shown:
                continue
            if self.given == "image-columns":
                place = self.columns[p % train.GRID]
            else:
                place = sum(self.codes[k][boxes[p][k]] for k in range(BOX_TOKENS))
            tokens[1 + p] = self.words[obj.category] + self.words[obj.colour] + place
        return tokens

    def object_positions(self, ids: torch.Tensor, scenes: list, examples: list) -> torch.Tensor:
        """``(batch, sequence)``: True at the image tokens of each example's named object
        (none for an absent one; image forms only)."""
        mask = torch.zeros(ids.shape, dtype=torch.bool)
        for i, (scene, example) in enumerate(zip(scenes, examples)):
            owner = train.patch_owners(scene)
            named = np.array([o >= 0 and scene.objects[o].category == example.meta["category"] for o in owner])
            image = (ids[i] == self.image_id).nonzero().flatten()
            mask[i, image[1:][torch.from_numpy(named)]] = True  # the image's first token is CLS's
        return mask

    def batch(self, seeds: list[int], with_answer: bool = True):
        """``(inputs_embeds, attention_mask, labels or None, examples)`` for ``seeds``;
        ``self.last_object_positions`` keeps :meth:`object_positions` of the image forms."""
        examples = [tasks.grounding(self.world, np.random.default_rng(s), s) for s in seeds]
        scenes = [self.world.scene(s) for s in seeds]
        if self.given == "text":
            prompts = [f"USER: {self.edges(_listing(sc, e.meta['category'], self.listed))} {e.question} ASSISTANT:"
                       for e, sc in zip(examples, scenes)]
        else:
            prompts = [format_prompt(e.question) for e in examples]
        texts = [f"{p} {self.answer(e)} {self.tok.eos_token}" if with_answer else p for p, e in zip(prompts, examples)]
        if self.given == "text":
            enc = self.tok(texts, return_tensors="pt", padding=True)
        else:
            enc = self.processor(text=texts, images=[e.images[0] for e in examples], return_tensors="pt", padding=True)
        ids = enc["input_ids"]
        with torch.no_grad():
            embeds = self.embed(ids.to(self.device))
        if self.given != "text":
            self.last_object_positions = self.object_positions(ids, scenes, examples).to(self.device)
            for i, scene in enumerate(scenes):
                embeds[i, ids[i].to(self.device) == self.image_id] = self._image_tokens(
                    scene, examples[i].meta["category"]).to(embeds)
        labels = train.answer_labels(self.tok, ids, [self.answer(e) for e in examples]) if with_answer else None
        return (embeds, enc["attention_mask"].to(self.device), None if labels is None else labels.to(self.device),
                examples)

    @torch.no_grad()
    def evaluate(self, n: int = 96, seed: int = 10**8) -> dict:
        """Greedy boxes on ``n`` held-out queries: IoU >= 0.5 and exact edges on present objects,
        "none" on absent ones."""
        was = self.model.training
        self.model.eval()
        embeds, mask, _, examples = self.batch(list(range(seed, seed + n)), with_answer=False)
        out = []
        for _ in range(BOX_TOKENS):
            nxt = self.model(inputs_embeds=embeds, attention_mask=mask).logits[:, -1].argmax(-1)
            out.append(nxt)
            embeds = torch.cat([embeds, self.embed(nxt)[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        self.model.train(was)
        answers = [self.shared(" ".join(self.tok.convert_ids_to_tokens(row))) for row in torch.stack(out, 1).tolist()]
        size = examples[0].images[0].width
        ious, edges, none_right, absent = [], np.zeros(BOX_TOKENS), 0, 0
        for e, a in zip(examples, answers):
            if e.answer == "none":
                absent += 1
                none_right += a.startswith("none")
                continue
            got, want = parse_box(a, size), parse_box(e.answer, size)
            ious.append(box_iou(got, want) if isinstance(got, tuple) else 0.0)
            edges += [g == w for g, w in zip(a.split(), e.answer.split())] if isinstance(got, tuple) else 0
        present = len(ious)
        return {"present": present, "iou50_rate": round(100.0 * float(np.mean([v >= 0.5 for v in ious])), 1),
                "exact_edges": [round(100.0 * v / max(present, 1), 1) for v in edges],
                "none_for_absent": f"{none_right}/{absent}"}


def _listed(scene, named: str | None = None, listed: int = 0) -> list:
    """The scene's boxed objects in reading order; with ``listed`` > 0 only that many: the
    ``named`` category's object and the first others in reading order."""
    boxes = scene.boxes()
    ordered = sorted((o for o in scene.objects if o.uid in boxes), key=lambda o: (o.cx, o.cy))
    if listed:
        ordered = sorted(ordered, key=lambda o: o.category != named)[:listed]
        ordered.sort(key=lambda o: (o.cx, o.cy))
    return ordered


def _listing(scene, named: str | None = None, listed: int = 0) -> str:
    """:func:`_listed`'s objects, each followed by its box tokens (``listed=1``: a pure copy
    of the only box in the prompt, no retrieval needed)."""
    boxes = scene.boxes()
    return " ".join(f"{o.colour} {o.category} {tasks.box_tokens(boxes[o.uid], scene.resolution)}"
                    for o in _listed(scene, named, listed))


def attention_mass(attentions, layer: int, head: int, objects: torch.Tensor) -> torch.Tensor:
    """Per example, the mean over the positions that write the box's four tokens of the
    attention mass ``head`` of ``layer`` (-1: the mean over its heads) puts on the named
    object's image tokens."""
    attn = attentions[layer][:, :, -BOX_TOKENS - 2 : -2]  # (batch, heads, 4 queries, keys)
    attn = attn.mean(1) if head == -1 else attn[:, head]
    return (attn * objects[:, None, :].to(attn)).sum(-1).mean(-1)


def finetune(task: CopyTask, steps: int, lr: float, batch: int, every: int, log,
             schedule: tuple[int, ...] = (), attend_weight: float = 0.0, attend_layer: int = 1,
             attend_head: int = 0) -> list[dict]:
    """Train the decoder on ``task`` for ``steps`` steps; the per-token losses and held-out
    scores every ``every`` steps. ``schedule``: a curriculum of ``task.listed`` values, each
    for an equal share of the steps (the held-out scores use the current one).

    ``attend_weight`` > 0 (image forms; session 40) adds ``attend_weight`` times the
    negative log of the attention mass that head ``attend_head`` of layer ``attend_layer``
    puts on the named object's image tokens from the positions that write its box
    (:func:`attention_mass`; present objects only): the retrieval the decoder did not find
    in any budget, supervised directly, as the object's patches are known in training. The
    model runs with eager attention then (its weights are read)."""
    model = task.model
    if attend_weight:
        if task.given == "text":
            raise ValueError("attend_weight: the attention target is the object's image tokens (image forms only)")
        model.set_attn_implementation("eager")
    decoder = train_decoder_only(model)
    opt = torch.optim.AdamW(decoder, lr=lr, weight_decay=0.01)
    none_id = task.tok.convert_tokens_to_ids("none")
    rows, running, start = [], None, time.time()
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50)
        if schedule:
            task.listed = schedule[min(len(schedule) - 1, step * len(schedule) // steps)]
        embeds, mask, labels, _ = task.batch([step * batch + i for i in range(batch)])
        out = model(inputs_embeds=embeds, attention_mask=mask, labels=labels, output_attentions=bool(attend_weight))
        loss = out.loss
        if attend_weight:
            objects = task.last_object_positions
            present = objects.any(1)
            mass = attention_mass(out.attentions, attend_layer, attend_head, objects)
            if present.any():
                loss = loss + attend_weight * -torch.log(mass[present] + 1e-6).mean()
            with torch.no_grad():
                running_mass = float(mass[present].mean()) if present.any() else float("nan")
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(decoder, 1.0)
        opt.step()
        with torch.no_grad():  # the box tokens are the last 4 before </s> (left padding)
            target = labels[:, -BOX_TOKENS - 1 : -1]
            boxed = (target[:, 0] != none_id) & (target != -100).all(1)
            logp = torch.log_softmax(out.logits[:, -BOX_TOKENS - 2 : -2].float(), -1)
            nll = -logp.gather(-1, target.clamp(min=0)[..., None]).squeeze(-1)[boxed].mean(0)
            running = nll if running is None else 0.95 * running + 0.05 * nll
        if (step + 1) % every == 0 or step == steps - 1:
            row = {"step": step + 1, "seconds": round(time.time() - start),
                   "box_token_nll": [round(v, 2) for v in running.tolist()], **task.evaluate()}
            if attend_weight:
                row["object_attention_mass"] = round(running_mass, 3)
            log(json.dumps(row))
            rows.append(row)
    model.eval()
    return rows


def main(argv=None) -> None:
    from .package import load_organism

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--given", choices=GIVEN, required=True, help="how the box is handed over (see above)")
    parser.add_argument("--path", default=None, help="an organism checkpoint folder (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--every", type=int, default=100, help="report every this many steps")
    parser.add_argument("--listed", default="0",
                        help="list (text) or code (image forms) only this many objects, the named one among them (0: all); "
                             "comma-separated counts are a curriculum, each for an equal share of the steps")
    parser.add_argument("--box-scale", type=float, default=0.5, help="--given image-codes / image-columns: the scale of the box code / the column token")
    parser.add_argument("--answer-tokens", choices=ANSWER_TOKENS, default="shared",
                        help="the organism's shared <cN> tokens, or per-edge <lN> <tN> <rN> <bN> added here (see ANSWER_TOKENS)")
    parser.add_argument("--attend-weight", type=float, default=0.0,
                        help="image forms: supervise one head's attention from the box positions to the named "
                             "object's image tokens, with this weight (see finetune)")
    parser.add_argument("--attend-layer", type=int, default=1)
    parser.add_argument("--attend-head", type=int, default=0, help="-1: every head of the layer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="where the decoder trains (batches are made on the host)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.every < 1 or args.batch < 1:
        parser.error("--steps, --every and --batch must be >= 1")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    try:
        schedule = tuple(int(v) for v in args.listed.split(","))
    except ValueError:
        parser.error(f"--listed must be counts separated by commas, got {args.listed!r}")
    if any(v < 0 for v in schedule):
        parser.error(f"--listed must be >= 0, got {args.listed}")
    if not args.box_scale > 0:
        parser.error(f"--box-scale must be > 0, got {args.box_scale}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, processor = load_organism(args.path)
    model.to(args.device)
    task = CopyTask(model, processor, args.given, args.box_scale, args.seed, schedule[0], args.answer_tokens)
    print(json.dumps({"step": 0, **task.evaluate()}))
    if args.attend_weight < 0:
        parser.error(f"--attend-weight must be >= 0, got {args.attend_weight}")
    finetune(task, args.steps, args.lr, args.batch, args.every, print, schedule if len(schedule) > 1 else (),
             args.attend_weight, args.attend_layer, args.attend_head)


if __name__ == "__main__":
    main()
