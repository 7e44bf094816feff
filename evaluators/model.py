"""The model under test: an HF VLM + processor (optionally with mitigations attached), or
any callable for models outside Hugging Face.

Both answer a batch of :class:`~evaluators.query.Query` objects with text. The HF wrapper
renders each prompt with the processor's chat template (images first, then the text),
left-pads the batch and calls plain ``model.generate()``; mitigations are attached for the
duration of the call and detached afterwards.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from hooks.prompting import user_prompt
from mitigate.base import IDENTITY_DIGEST

from .box_frames import default_box_frame, get_box_frame
from .grounding_formats import DEFAULT_FORMAT, default_grounding_format, get_grounding_format, worded
from .query import Query


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def callable_name(fn: Any) -> str:
    """``module.qualname`` of a function, method or class, the same in every process
    (``__main__.my_detector``, ``mypkg.det.<locals>.<lambda>``); a ``functools.partial``
    as ``functools.partial(<its function>, <its arguments>)``; a callable object by its class.
    Two closures of one function, or two instances of one class, read alike."""
    import functools

    if isinstance(fn, functools.partial):
        args = [stable_text(repr(a)) for a in fn.args] + [f"{k}={stable_text(repr(v))}" for k, v in fn.keywords.items()]
        return f"functools.partial({', '.join([callable_name(fn.func), *args])})"
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', None) or '?'}.{target.__qualname__}"


def stable_text(text: str) -> str:
    """``text`` without memory addresses (" at 0x7f..."), which change with every process."""
    return _ADDRESS.sub("", text)


def stable_repr(obj: Any) -> str:
    """``repr(obj)`` as the run identity keeps it: a callable attribute whose repr carries a
    memory address (``localizer=<function my_detector at 0x7fa3...>``, which differs in
    every process and made a run with CropVerify's ``localizer`` refuse every resume) is
    named by :func:`callable_name` (``<function __main__.my_detector>``), and any other
    address is cut. A repr without an address is unchanged, so folders written before
    resume as they did."""
    text = _with_digests(obj, repr(obj))
    if not _ADDRESS.search(text):
        return text
    for value in getattr(obj, "__dict__", {}).values():
        if callable(value) and _ADDRESS.search(shown := repr(value)):
            kind = "function" if inspect.isroutine(value) or isinstance(value, type) else "callable"
            text = text.replace(shown, f"<{kind} {callable_name(value)}>")
    return stable_text(text)


def _digest(value: Any) -> str:
    import hashlib
    import json

    # a value JSON cannot write (an object) by its repr without memory addresses, the same in every process
    text = json.dumps(value, sort_keys=True, default=lambda v: stable_text(repr(v)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _with_digests(obj: Any, text: str) -> str:
    """``text`` (``repr(obj)``) with ``name=<sha256 ...>`` added for each of ``obj``'s dataclass
    fields marked :data:`mitigate.base.IDENTITY_DIGEST` whose value is not None; unchanged without one, so
    folders written before such a field existed resume."""
    import dataclasses

    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return text
    extra = [f"{f.name}=<sha256 {_digest(value)}>" for f in dataclasses.fields(obj)
             if f.metadata.get(IDENTITY_DIGEST) and (value := getattr(obj, f.name, None)) is not None]
    if not extra:
        return text
    if not text.endswith(")"):
        return f"{text} [{', '.join(extra)}]"
    return f"{text[:-1]}{'' if text.endswith('()') else ', '}{', '.join(extra)})"


def processor_digest(processor: Any) -> str | None:
    """A digest of how ``processor`` turns a query into the model's input: its saved
    configuration (``to_json_string()``: image sizes, crops, normalisation, placeholder
    counts) and its chat template. The same weights under another prompt format (a Hub
    repo's updated chat template, an edited ``preprocessor_config.json``) answer other
    prompts, so a run does not resume across it. None without a processor."""
    if processor is None:
        return None
    try:
        config = processor.to_json_string()
    except Exception as err:  # noqa: BLE001 - a processor that cannot print its config: its class stands in
        config = f"<{type(processor).__name__}: no to_json_string ({type(err).__name__})>"
    template = getattr(processor, "chat_template", None)
    if template is None:
        template = getattr(getattr(processor, "tokenizer", None), "chat_template", None)
    return _digest([config, template])


#: a prompt whose chat template opened a reasoning block for the answer
_OPENS_THINKING = re.compile(r"(<think>|◁think▷)\s*$")


class HFModel:
    def __init__(self, model, processor, *, mitigations: Sequence = (), max_new_tokens: int = 16,
                 generate_kwargs: dict | None = None, name: str | None = None, box_frame: str | None = None,
                 grounding_format: str | None = None) -> None:
        """``grounding_format``: how a grounding query (HalluSegBench) asks this model for a
        box (:mod:`evaluators.grounding_formats`; default: its family's, by
        ``config.model_type``). Its box answers are generated with at least the new tokens the
        format needs (``answer_tokens``), whatever ``max_new_tokens`` the rest get.
        ``box_frame``: the coordinate frame the model writes boxes in
        (:mod:`evaluators.box_frames`; default: its family's where the family is listed -- the
        frame is the checkpoint's, whatever wording asks it -- else the grounding format's,
        else pixels)."""
        self.model = model.eval()
        self.processor = processor
        self.mitigations = list(mitigations)
        self.max_new_tokens = max_new_tokens
        self.generate_kwargs = {"do_sample": False, **(generate_kwargs or {})}
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.grounding = get_grounding_format(grounding_format or default_grounding_format(model))
        self.box_frame = get_box_frame(box_frame or default_box_frame(model, self.grounding.frame)).name

    def describe(self) -> dict[str, Any]:
        """What the answers depend on, the same in every process (a run resumes by it):
        mitigations by :func:`stable_repr`, a function they hold by module and name; the
        processor's configuration and chat template by :func:`processor_digest`. Not the
        grounding format: the runner fingerprints each query as it is asked (:meth:`asked`),
        so a grounding query worded otherwise is another question, and the rest resume."""
        return {
            "model": self.name,
            "model_class": type(self.model).__name__,
            "mitigations": [stable_repr(m) for m in self.mitigations],
            "max_new_tokens": self.max_new_tokens,
            "generate_kwargs": self.generate_kwargs,
            "processor": processor_digest(self.processor),
        }  # not box_frame: it changes how answers are read, not what is answered (runner.with_box_frame)

    def asked(self, query: Query) -> Query:
        """``query`` as this model is asked it: a grounding query in its grounding format."""
        return worded(query, self.grounding)

    @property
    def grounding_tokens(self) -> int:
        """The new tokens a grounding query's answer is generated with."""
        return max(self.max_new_tokens, self.grounding.answer_tokens)

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
        """The query as the processor expects it: its chat template, or for a checkpoint
        without one (PaliGemma's) the image placeholders then the text (:mod:`hooks.prompting`)."""
        return user_prompt(self.processor, query.prompt, len(query.images))

    @torch.no_grad()
    def __call__(self, queries: Sequence[Query]) -> list[str]:
        queries = [self.asked(q) for q in queries]
        boxes = [i for i, q in enumerate(queries) if q.grounding]
        if not boxes or self.grounding_tokens == self.max_new_tokens:
            return self._answer(queries, self.max_new_tokens)
        # box answers need more new tokens than the rest (a Qwen JSON box takes 30-60): they
        # are generated apart, with the format's budget; the rest as asked
        answers: list[str | None] = [None] * len(queries)
        others = [i for i in range(len(queries)) if not queries[i].grounding]
        for rows, budget in ((boxes, self.grounding_tokens), (others, self.max_new_tokens)):
            if rows:
                for i, answer in zip(rows, self._answer([queries[i] for i in rows], budget)):
                    answers[i] = answer
        return answers

    def _answer(self, queries: Sequence[Query], max_new_tokens: int) -> list[str]:
        reaskers = [m for m in self.mitigations if hasattr(m, "answer")]
        hooks = [m for m in self.mitigations if not hasattr(m, "answer")]
        if reaskers:  # crop-and-verify: needs the original images, answers through its own passes
            from mitigate import attach
            from mitigate.which_image import parse_multi_image

            (reasker,) = reaskers
            kwargs = {"max_new_tokens": max_new_tokens, **self.generate_kwargs}

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
                plain = self._generate(rest, hooks, max_new_tokens)
                it = iter(plain)
                answers = [a if a is not None else next(it) for a in answers]
            return answers
        return self._generate(queries, hooks, max_new_tokens)

    def _generate(self, queries: Sequence[Query], hooks: Sequence, max_new_tokens: int) -> list[str]:
        texts = [self.prompt(q) for q in queries]
        # one list of images per prompt: a flat list is read as one prompt's images by some
        # processors (Gemma3's), which then refuse a batch
        images = [q.load_images() for q in queries]
        enc = self.processor(text=texts, images=images if any(images) else None, return_tensors="pt", padding=True)
        enc = enc.to(self.model.device)
        if hooks:
            from mitigate import attach

            with attach(self.model, *hooks):
                out = self.model.generate(**enc, max_new_tokens=max_new_tokens, **self.generate_kwargs)
        else:
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens, **self.generate_kwargs)
        answers = [t.strip() for t in self.processor.batch_decode(out[:, enc["input_ids"].shape[1]:],
                                                                   skip_special_tokens=True)]
        # a chat template that opens the think block in the prompt (thinking models) leaves the
        # answer only its closing tag: the opening one is put back, so that an answer cut off
        # while thinking reads as unanswered, not as its reasoning (answers.after_reasoning)
        return [f"{opened.group(1)}{a}" if (opened := _OPENS_THINKING.search(t)) else a for t, a in zip(texts, answers)]


class CallableModel:
    """``fn(images, prompt) -> answer`` for a model outside Hugging Face.

    The answer is text; a number or bool (stored as text); Python lists / dicts (a box, a
    polygon, an RLE: stored as JSON text); or -- for a segmentation model -- a mask (2-D
    numpy array, PIL image or torch tensor; ``> 0`` is the object). ``None`` abstains.
    Masks are stored as COCO uncompressed-RLE JSON (:func:`evaluators.masks.encode_mask`),
    so every line of ``samples.jsonl`` stays text and a rerun re-scores it.

    A run resumes only with the same model (:func:`evaluators.runner.run_identity`): the
    identity holds ``name`` and the function by module and qualified name
    (:func:`callable_name`), so another function is refused on resume as another HF model
    is. Two closures of one function (``make_model("a")`` and ``make_model("b")``), or two
    instances of one callable class, look alike unless named: pass each its own ``name``.

    ``grounding_format``: how a grounding query (HalluSegBench) words its prompt for ``fn``
    (:mod:`evaluators.grounding_formats`; default the toolkit's own wording); ``box_frame``:
    the coordinate frame of the boxes it writes as numbers (:mod:`evaluators.box_frames`;
    default the grounding format's, else pixels of the asked image).
    """

    def __init__(self, fn: Callable[[list, str], Any], name: str = "callable", box_frame: str | None = None,
                 grounding_format: str = DEFAULT_FORMAT) -> None:
        if not callable(fn):
            raise ValueError("fn must be callable: fn(images, prompt) -> str or mask")
        self.fn, self.name = fn, name
        self.grounding = get_grounding_format(grounding_format)
        self.box_frame = get_box_frame(box_frame or default_box_frame(None, self.grounding.frame)).name

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "model_class": "callable", "fn": callable_name(self.fn)}

    def asked(self, query: Query) -> Query:
        """``query`` as ``fn`` is asked it: a grounding query in the grounding format."""
        return worded(query, self.grounding)

    def __call__(self, queries: Sequence[Query]) -> list[str]:
        from .masks import encode_mask

        import json

        out = []
        for q in queries:
            answer = self.fn(q.load_images(), self.asked(q).prompt)
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


class ModelSpecError(ValueError):
    """A model id or path that names no loadable model: a folder that does not exist, or a
    Hub id that is neither a local folder nor loadable from the Hub. The message is one line
    (the command-line tools print it as a usage error of ``--model``)."""


#: a Hub repo id: ``name`` or ``org/name``, each part of letters, digits, '-', '_' and '.',
#: neither starting nor ending with '-' or '.' (the Hub's own rule)
_HUB_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` could be a Hub repo id (``name`` or ``org/name``) rather than a path."""
    parts = spec.split("/")
    return (0 < len(parts) <= 2 and len(spec) <= 96 and "--" not in spec and ".." not in spec
            and all(_HUB_PART.fullmatch(part) for part in parts))


def resolve_model(spec: str) -> str:
    """The folder or Hub id that ``spec`` names, or a :class:`ModelSpecError`.

    ``"organism"`` is the shipped checkpoint; a value that exists locally is that folder
    (even when it also reads as a Hub id, as Hugging Face reads it); a value that does not
    exist and cannot be a Hub id (``./x``, ``/x``, ``~/x``, ``a/b/c``) is a missing folder --
    Hugging Face would report it as a malformed repo id. Anything else is left to the Hub.
    """
    if spec == "organism":
        from .organism import ORGANISM_DIR

        return str(ORGANISM_DIR)
    if not spec.strip():
        raise ModelSpecError("no model given: name a model folder, a Hub id or 'organism'")
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelSpecError(f"{spec!r} is a file, not a model folder (a folder holding config.json and the "
                                 "weights, or a Hub id such as llava-hf/llava-1.5-7b-hf)")
        return str(path)
    if not is_hub_id(spec):
        raise ModelSpecError(f"no such folder: {spec!r} ({path.absolute()} does not exist)")
    import difflib

    if "/" not in spec and difflib.get_close_matches(spec.lower(), ["organism"], n=1, cutoff=0.75):
        # a one-word Hub id this close to the shipped model's name is almost surely a typo of it;
        # the Hub would be tried first (retries, and a long wait offline)
        raise ModelSpecError(f"no such folder: {spec!r}. Did you mean 'organism' (the shipped checkpoint)?")
    return spec


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def from_pretrained(loader: Any, spec: str, **kwargs):
    """``loader.from_pretrained(resolve_model(spec), **kwargs)``, a model that cannot be
    found or fetched raising a one-line :class:`ModelSpecError` that says what was tried
    (Hugging Face's own is a long traceback ending in a message about the Hub, also for a
    mistyped local folder)."""
    resolved = resolve_model(spec)
    try:
        return loader.from_pretrained(resolved, **kwargs)
    except (OSError, ValueError) as err:
        # OSError: files missing or not fetched; ValueError: a config.json of no known model
        # ("Unrecognized model in ...", "Unrecognized configuration class ..."); any other
        # ValueError (a device map accelerate refuses, ...) keeps its traceback
        if isinstance(err, ValueError) and not str(err).startswith("Unrecognized"):
            raise
        if Path(resolved).is_dir():
            raise ModelSpecError(f"the folder {spec!r} holds no model {_name(loader)} can load "
                                 f"({_first_line(err)})") from err
        if isinstance(err, ValueError):
            raise ModelSpecError(f"{spec!r} is not a model {_name(loader)} can load ({_first_line(err)})") from err
        raise ModelSpecError(f"{spec!r} is neither a local folder nor loadable from the Hugging Face Hub "
                             f"({_first_line(err)})") from err


def _name(loader: Any) -> str:
    return getattr(loader, "__name__", type(loader).__name__)


def _load_kwargs(attn_implementation: str = "sdpa", dtype: str | None = None, device: str | None = None,
                 device_map: str | dict | None = None, max_memory: dict | None = None) -> tuple[dict, str | None]:
    """``from_pretrained`` keyword arguments and the device to move to, or a ``ValueError``
    (every check of :func:`load_hf`'s arguments that needs no model)."""
    if device is not None and device_map is not None:
        raise ValueError("give device (one device) or device_map (a split), not both")
    if max_memory is not None and device_map is None:
        raise ValueError("max_memory bounds a device_map split; give device_map too")
    if device is not None:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch device such as cpu, cuda, cuda:1 or mps, got {device!r}") from None
        if kind == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device}: no CUDA GPU is visible to this process")
    _check_attention(attn_implementation)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if dtype:
        if str(dtype) not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        kwargs["dtype"] = DTYPES[str(dtype)]
    if device_map is not None:
        kwargs["device_map"] = device_map
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
    return kwargs, device


def _check_attention(name: Any) -> None:
    """``attn_implementation``: one transformers registers (``eager``, ``sdpa``, the flash
    and flex kernels, their ``paged|`` forms) or a Hub kernel (``org/repo``, which transformers
    fetches and checks itself); a typo was a traceback from ``from_pretrained``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hooks.errors import unknown

    if name is None:  # transformers' own default
        return
    if not isinstance(name, str):
        raise ValueError(f"attn_implementation must be a name such as sdpa or eager, got {name!r}")
    known = {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    known |= {f"paged|{k}" for k in list(known) if "|" not in k}
    if name in known or "/" in name:
        return
    raise ValueError(unknown("attn_implementation", name, known) + " (or a Hub kernel, org/repo)")


def check_model_args(model_args: dict[str, Any]) -> None:
    """A ``ValueError`` naming what is wrong in :func:`load_hf` keyword arguments (an unknown
    one, a dtype it does not know, ...), before any model is loaded."""
    known = [name for name in inspect.signature(_load_kwargs).parameters]
    unknown = sorted(set(model_args) - set(known))
    if unknown:
        raise ValueError(f"unknown argument(s) {unknown}; the arguments are {known}")
    _load_kwargs(**model_args)


def load_hf(spec: str, *, attn_implementation: str = "sdpa", dtype: str | None = None, device: str | None = None,
            device_map: str | dict | None = None, max_memory: dict | None = None):
    """``(model, processor)`` for ``"organism"`` (the shipped checkpoint) or an HF id / path.

    ``device`` puts the whole model on one device; ``device_map`` (``"auto"``, or a module ->
    device dict) lets accelerate split it over the GPUs (within ``max_memory``) for models
    that do not fit on one. Mitigation hooks follow the split: every tensor they create is
    made on the device of the activations it meets.

    A folder that does not exist, or a Hub id that cannot be loaded, raises a one-line
    :class:`ModelSpecError` (a ``ValueError``).
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kwargs, device = _load_kwargs(attn_implementation, dtype, device, device_map, max_memory)
    model = from_pretrained(AutoModelForImageTextToText, spec, **kwargs)
    if device:
        model = model.to(device)
    return model, from_pretrained(AutoProcessor, spec)


#: well-known ``generate()`` arguments by the type their value must have (a value of another
#: type failed deep inside ``generate()``, after the model had loaded: ``num_beams="two"``)
GENERATE_INTS = ("max_length", "min_length", "min_new_tokens", "num_beams", "num_beam_groups", "top_k",
                 "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_return_sequences",
                 "prompt_lookup_num_tokens", "num_assistant_tokens", "prefill_chunk_size")
GENERATE_FLOATS = ("temperature", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
                   "repetition_penalty", "encoder_repetition_penalty", "length_penalty", "diversity_penalty",
                   "penalty_alpha", "guidance_scale", "max_time")
GENERATE_BOOLS = ("do_sample", "use_cache", "renormalize_logits", "remove_invalid_values", "output_attentions",
                  "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "low_memory")
#: counts that must be at least 1
_GENERATE_POSITIVE = ("max_length", "num_beams", "num_beam_groups", "num_return_sequences")


def check_generate_kwargs(kwargs: dict[str, Any]) -> None:
    """A ``ValueError`` naming a ``generate()`` argument whose value cannot work, without a
    model: the type of the well-known integer, float and bool arguments, the counts that
    must be positive, and what ``transformers.GenerationConfig`` itself refuses. A name that
    is neither a ``GenerationConfig`` field nor a ``generate()`` parameter but spelt like one
    (``do_sampel``) is refused as a typo: ``GenerationConfig`` keeps unknown names silently,
    and ``generate()`` then fails on the first batch, after the model has loaded. Other
    unknown names pass: ``generate()`` also hands the model's forward its own arguments
    (``vision_feature_layer``) and a Hub ``custom_generate`` recipe its own
    (``trust_remote_code``)."""
    import difflib

    from transformers import GenerationConfig, GenerationMixin

    known = set(GenerationConfig().to_dict()) | set(inspect.signature(GenerationMixin.generate).parameters)
    known -= {"self", "kwargs", "inputs"}
    for key in sorted(set(kwargs) - known):
        if close := difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.8):
            raise ValueError(f"unknown generate() argument {key!r}. Did you mean {close}? (the names are "
                             "transformers.GenerationConfig's fields and generate()'s parameters)")
    for key, value in kwargs.items():
        if key in GENERATE_INTS and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        if key in GENERATE_FLOATS and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        if key in GENERATE_BOOLS and not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        if key in _GENERATE_POSITIVE and value < 1:
            raise ValueError(f"{key} must be at least 1, got {value!r}")
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its advice on flag combinations comes again, once, from generate()
    try:
        GenerationConfig(**kwargs).validate()
    except (ValueError, TypeError) as err:
        raise ValueError(f"generate() would refuse these arguments: {_first_line(err)}") from None
    finally:
        logging.set_verbosity(verbosity)
