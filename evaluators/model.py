"""The model under test: an HF VLM + processor (optionally with mitigations attached), or
any callable for models outside Hugging Face.

Both answer a batch of :class:`~evaluators.query.Query` objects with text. The HF wrapper
renders each prompt with the processor's chat template (images first, then the text),
left-pads the batch and calls plain ``model.generate()``; mitigations are attached for the
duration of the call and detached afterwards.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .query import Query


class HFModel:
    def __init__(self, model, processor, *, mitigations: Sequence = (), max_new_tokens: int = 16,
                 generate_kwargs: dict | None = None, name: str | None = None) -> None:
        self.model = model.eval()
        self.processor = processor
        self.mitigations = list(mitigations)
        self.max_new_tokens = max_new_tokens
        self.generate_kwargs = {"do_sample": False, **(generate_kwargs or {})}
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "model_class": type(self.model).__name__,
            "mitigations": [repr(m) for m in self.mitigations],
            "max_new_tokens": self.max_new_tokens,
            "generate_kwargs": self.generate_kwargs,
        }

    @torch.no_grad()
    def weights_digest(self) -> str:
        """A digest of the weights (every parameter's name, shape, dtype and 80 of its values,
        strided over the tensor): a retrained checkpoint at the same path gets a new one, so
        a resumed run never mixes its answers with another model's. Cheap on a 70B model."""
        import hashlib

        h = hashlib.sha256()
        for name, p in self.model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = torch.cat([flat[:8], flat[-8:], flat[:: max(1, flat.numel() // 64)][:64]])
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
            h.update(sample.float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def prompt(self, query: Query) -> str:
        content = [{"type": "image"} for _ in query.images] + [{"type": "text", "text": query.prompt}]
        messages = [{"role": "user", "content": content}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True)

    @torch.no_grad()
    def __call__(self, queries: Sequence[Query]) -> list[str]:
        reaskers = [m for m in self.mitigations if hasattr(m, "answer")]
        hooks = [m for m in self.mitigations if not hasattr(m, "answer")]
        if reaskers:  # crop-and-verify: needs the original images, answers through its own passes
            from mitigate import attach
            from mitigate.which_image import parse_multi_image

            (reasker,) = reaskers
            kwargs = {"max_new_tokens": self.max_new_tokens, **self.generate_kwargs}

            def run(method, images, prompts):
                if not hooks:
                    return method(self.model, images, prompts, **kwargs)
                with attach(self.model, *hooks):
                    return method(self.model, images, prompts, **kwargs)

            answers: list[str | None] = [None] * len(queries)
            single = [i for i, q in enumerate(queries) if len(q.images) == 1]
            # multi-image existence questions ("in which image is there ...?", "is there ... in
            # the images?"): verified image by image when the mitigation asks for it
            # (CropVerify(which_image=True))
            which = [i for i, q in enumerate(queries) if len(q.images) > 1 and getattr(reasker, "which_image", False)
                     and parse_multi_image(q.prompt, len(q.images)) is not None]
            if single:
                got = run(reasker.answer, [queries[i].load_images()[0] for i in single],
                          [queries[i].prompt for i in single])
                for i, r in zip(single, got):
                    answers[i] = r["answer"]
            if which:
                got = run(reasker.answer_which_image, [queries[i].load_images() for i in which],
                          [queries[i].prompt for i in which])
                for i, r in zip(which, got):
                    answers[i] = r["answer"]
            rest = [q for q, a in zip(queries, answers) if a is None]
            if rest:  # other multi-image questions: crop-and-verify does not apply; counted, answered plainly
                reasker.stats["not_applicable"] = reasker.stats.get("not_applicable", 0) + len(rest)
                plain = self._generate(rest, hooks)
                it = iter(plain)
                answers = [a if a is not None else next(it) for a in answers]
            return answers
        return self._generate(queries, hooks)

    def _generate(self, queries: Sequence[Query], hooks: Sequence) -> list[str]:
        texts = [self.prompt(q) for q in queries]
        # one list of images per prompt: a flat list is read as one prompt's images by some
        # processors (Gemma3's), which then refuse a batch
        images = [q.load_images() for q in queries]
        enc = self.processor(text=texts, images=images if any(images) else None, return_tensors="pt", padding=True)
        enc = enc.to(self.model.device)
        if hooks:
            from mitigate import attach

            with attach(self.model, *hooks):
                out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, **self.generate_kwargs)
        else:
            out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, **self.generate_kwargs)
        return [t.strip() for t in self.processor.batch_decode(out[:, enc["input_ids"].shape[1]:],
                                                                skip_special_tokens=True)]


class CallableModel:
    """``fn(images, prompt) -> answer`` for a model outside Hugging Face.

    The answer is text; a number or bool (stored as text); Python lists / dicts (a box, a
    polygon, an RLE: stored as JSON text); or -- for a segmentation model -- a mask (2-D
    numpy array, PIL image or torch tensor; ``> 0`` is the object). ``None`` abstains.
    Masks are stored as COCO uncompressed-RLE JSON (:func:`evaluators.masks.encode_mask`),
    so every line of ``samples.jsonl`` stays text and a rerun re-scores it.
    """

    def __init__(self, fn: Callable[[list, str], Any], name: str = "callable") -> None:
        if not callable(fn):
            raise ValueError("fn must be callable: fn(images, prompt) -> str or mask")
        self.fn, self.name = fn, name

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "model_class": "callable"}

    def __call__(self, queries: Sequence[Query]) -> list[str]:
        from .masks import encode_mask

        import json

        out = []
        for q in queries:
            answer = self.fn(q.load_images(), q.prompt)
            if answer is None:
                out.append("none")  # an explicit abstention
            elif isinstance(answer, str):
                out.append(answer)
            elif isinstance(answer, (bool, int, float)):
                out.append(str(answer).lower() if isinstance(answer, bool) else str(answer))
            elif isinstance(answer, (list, tuple, dict)):  # a box, polygon or RLE as Python data
                out.append(json.dumps(answer))
            else:
                try:
                    out.append(encode_mask(answer))
                except ValueError as err:
                    raise TypeError(
                        f"{self.name} answered query {q.id!r} with {type(answer).__name__}: expected text, a "
                        f"number, JSON-like data (box, polygon, RLE) or a 2-D mask array/image/tensor ({err})"
                    ) from None
        return out


DTYPES: dict[str, Any] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "auto": "auto",
}
"""``dtype`` names :func:`load_hf` accepts ("auto": the dtype the checkpoint was saved in)."""


def load_hf(spec: str, *, attn_implementation: str = "sdpa", dtype: str | None = None, device: str | None = None,
            device_map: str | dict | None = None, max_memory: dict | None = None):
    """``(model, processor)`` for ``"organism"`` (the shipped checkpoint) or an HF id / path.

    ``device`` puts the whole model on one device; ``device_map`` (``"auto"``, or a module ->
    device dict) lets accelerate split it over the GPUs (within ``max_memory``) for models
    that do not fit on one. Mitigation hooks follow the split: every tensor they create is
    made on the device of the activations it meets.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if spec == "organism":
        from .organism import ORGANISM_DIR

        spec = str(ORGANISM_DIR)
    if device is not None and device_map is not None:
        raise ValueError("give device (one device) or device_map (a split), not both")
    if max_memory is not None and device_map is None:
        raise ValueError("max_memory bounds a device_map split; give device_map too")
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if dtype:
        if str(dtype) not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        kwargs["dtype"] = DTYPES[str(dtype)]
    if device_map is not None:
        kwargs["device_map"] = device_map
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
    model = AutoModelForImageTextToText.from_pretrained(spec, **kwargs)
    if device:
        model = model.to(device)
    return model, AutoProcessor.from_pretrained(spec)
