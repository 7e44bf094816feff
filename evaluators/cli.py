"""``vlm-eval``: run benchmark suites on a model, with flags lmms-eval users know.

    vlm-eval --model organism --tasks dobench --limit 40 --output_path runs/organism
    vlm-eval --model organism --tasks dobench --mitigations vcd:alpha=1,prior_suppression:mode=context \\
             --batch_size 8 --output_path runs/mitigated
    vlm-eval --model llava-hf/llava-1.5-7b-hf --model_args dtype=bfloat16,device=cuda --tasks dobench ...

``--tasks`` names built-in probe suites (generated from the counterfactual world, seeded);
``--limit`` keeps the first N queries of each; a rerun with the same ``--output_path``
resumes. Results go to ``<output_path>/results.json`` and per-sample lines to
``<output_path>/samples.jsonl``.

Large models: ``--model_args device_map=auto,dtype=bf16`` (dtype: bf16, fp16, fp32 or auto).
Several GPUs or nodes: the same command under ``accelerate launch`` or ``torchrun``; each
process answers its shard, the main process merges and scores::

    accelerate launch --multi_gpu --num_processes 8 -m evaluators.cli --model ... --output_path runs/x
    torchrun --nnodes 2 --nproc_per_node 8 ... -m evaluators.cli --model ... --output_path /shared/runs/x
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import Any

from .benchmarks.suites import SCALES


#: Python's spellings of JSON's literals: ``generic_prompt=none`` had reached CropVerify as the
#: string "none" -- a generic prompt of that one word -- not as "no generic prompt".
_LITERALS = {"none": None, "None": None, "True": True, "False": False}


def _value(text: str) -> Any:
    """A flag value: JSON (``1``, ``0.5``, ``true``, ``null``, ``[1, 2]``), Python's
    ``None`` / ``none`` / ``True`` / ``False``, else the text itself."""
    if text in _LITERALS:
        return _LITERALS[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_kv(text: str | None, flag: str = "", form: str = "key=value") -> dict[str, Any]:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (values parsed as JSON when they are JSON);
    ``flag`` and ``form`` say in an error which option was misread and what it takes."""
    out: dict[str, Any] = {}
    for part in filter(None, (text or "").split(",")):
        if "=" not in part:
            where = f"{flag} takes " if flag else "expected "
            raise ValueError(f"{where}{form}[,{form}], got {part!r}")
        key, value = part.split("=", 1)
        if key.strip() in out:  # the later one silently won (two data files of one benchmark)
            raise ValueError(f"{key.strip()!r} is given twice in {text!r} (one value each; several HalluSegBench "
                             "subsets load together from the folder that holds them)")
        out[key.strip()] = _value(value.strip())
    return out


class _NeedsModel(Exception):
    """A mitigation read the tokenizer or processor while it was being made: its values can
    be checked only once the model is loaded."""


class _NotLoaded:
    """Stands for the tokenizer and processor while ``--mitigations`` is checked before the
    model loads; using it in any way raises :class:`_NeedsModel`."""

    def __getattr__(self, name):
        raise _NeedsModel(name)

    def __call__(self, *args, **kwargs):
        raise _NeedsModel("__call__")

    def __len__(self):
        raise _NeedsModel("__len__")

    def __iter__(self):
        raise _NeedsModel("__iter__")

    def __repr__(self) -> str:
        return "<not loaded>"


def include(spec: str) -> None:
    """Import each comma-separated Python module name or ``.py`` file of ``spec`` (``--include``),
    so that the mitigations and report arms it registers (``@mitigate.register``,
    ``register_arm``) can be named in ``--mitigations`` / ``--arms``; a ``ValueError`` naming
    what could not be imported and why.

    A file is imported as the module its name makes (``my_mits.py`` -> ``my_mits``) with its
    folder on ``sys.path``, as ``python my_mits.py``'s neighbours would import it: a plugin
    split over two files (``my_arms.py`` doing ``from my_mits import ...``) loads once, not
    twice under two names. A file already imported is run again (a notebook's edited cell),
    so its registrations are the file's; a module of the same name from another file is refused."""
    import importlib
    from pathlib import Path

    for item in (part.strip() for part in (spec or "").split(",")):
        if not item:
            continue
        try:
            if item.endswith(".py"):
                path = Path(item).resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such file: {item}")
                name = path.stem
                if not name.isidentifier():
                    raise ValueError(f"{path.name} cannot be imported as a module (its name is not an identifier)")
                loaded = sys.modules.get(name)
                if loaded is not None:
                    where = getattr(loaded, "__file__", None)
                    if where is None or Path(where).resolve() != path:
                        raise ValueError(f"a module named {name!r} is imported already (from {where}); rename "
                                         f"{path.name}")
                    importlib.reload(loaded)
                    continue
                if str(path.parent) not in sys.path:
                    sys.path.insert(0, str(path.parent))
                importlib.import_module(name)
            else:  # a module or package name (a folder of that name here is found the same way)
                importlib.import_module(item)
        except Exception as err:  # noqa: BLE001 - any failure of user code is reported by name
            raise ValueError(f"--include: could not import {item!r}: {type(err).__name__}: {err}") from err


def check_mitigations(text: str | None) -> None:
    """A ``ValueError`` naming what is wrong in a ``--mitigations`` value -- an unknown
    mitigation or argument, or a value the mitigation refuses (``vcd:alpha=-1``) -- before
    any model is loaded. Each mitigation is made with a stand-in for the tokenizer and
    processor, so its own checks run (a mitigation that reads them while being made is
    checked once the model has loaded)."""
    try:
        specs = list(_mitigation_specs(text))
    except KeyError as err:
        raise ValueError(f"--mitigations: {err.args[0]} (mitigations are separated by ',', a mitigation's "
                         "arguments follow ':' and are separated by ';')") from None
    for name, cls, kwargs in specs:
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"--mitigations: {name} has no argument(s) {unknown}; it takes {sorted(known)}")
        placeholder = _NotLoaded()
        try:
            _make(cls, kwargs, placeholder, placeholder)
        except _NeedsModel:
            continue
        except ValueError as err:
            raise ValueError(f"--mitigations: {name}: {err}") from None
        except TypeError as err:  # a value of the wrong kind met a comparison ('>' between str and int)
            given = ";".join(f"{k}={v!r}" for k, v in kwargs.items())
            raise ValueError(f"--mitigations: {name}: a value of the wrong type in {given} ({err})") from None


def _mitigation_specs(text: str | None):
    """``(name, class, keyword arguments)`` per mitigation of a ``--mitigations`` value."""
    from mitigate import get_mitigation

    for item in filter(None, (text or "").split(",")):
        name, _, args = item.partition(":")
        mitigation = get_mitigation(name.strip())
        if bad := [a for a in args.split(";") if a.strip() and "=" not in a]:
            raise ValueError(f"--mitigations: {name.strip()}: expected key=value, got {bad[0].strip()!r} (a "
                             "mitigation's arguments follow ':' and are separated by ';': vcd:alpha=1;beta=0.1)")
        yield name.strip(), mitigation, parse_kv(args.replace(";", ","))


def _make(cls: type, kwargs: dict[str, Any], tokenizer: Any, processor: Any):
    kwargs = dict(kwargs)
    names = {f.name for f in dataclasses.fields(cls)}
    if "tokenizer" in names and "tokenizer" not in kwargs:
        kwargs["tokenizer"] = tokenizer
    if "processor" in names and "processor" not in kwargs:
        kwargs["processor"] = processor
    return cls(**kwargs)


def parse_mitigations(text: str | None, tokenizer: Any, processor: Any = None) -> list:
    """``"vcd:alpha=1;beta=0.1,prior_suppression:mode=output"`` -> mitigation objects.

    Mitigations are separated by commas; a mitigation's own arguments follow a colon and
    are separated by semicolons.
    """
    return [_make(cls, kwargs, tokenizer, processor) for _, cls, kwargs in _mitigation_specs(text)]


def check_model(parser: argparse.ArgumentParser, spec: str, model_args: dict[str, Any]) -> None:
    """``--model`` and ``--model_args`` checked without loading anything: a missing folder,
    an unknown argument or a bad value is a usage error at once (a Hub id is tried when
    the model loads)."""
    from .model import ModelSpecError, check_model_args, resolve_model

    try:
        resolve_model(spec)
    except ModelSpecError as err:
        parser.error(f"--model: {err}")
    try:
        check_model_args(model_args)
    except ValueError as err:
        parser.error(f"--model_args: {err}")


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    """``--judge``, ``--judge_args`` and ``--judge_batch_size``, as vlm-eval and vlm-report take them."""
    parser.add_argument("--judge", default=None,
                        help="an HF text model (folder or Hub id) that grades ReactBench's answers as its paper "
                             "does (App. C.1), once every answer is in; the rule's grade is kept beside it "
                             "(evaluators/judge.py)")
    parser.add_argument("--judge_args", default="",
                        help="as --model_args, for the judge model, and max_new_tokens= (its reply's length, default 8)")
    parser.add_argument("--judge_batch_size", type=int, default=None, help="the judge's batch (default 8)")


def judge_options(parser: argparse.ArgumentParser, args: argparse.Namespace, queries: list) -> dict[str, Any]:
    """``--judge``, ``--judge_args`` and ``--judge_batch_size`` checked before any model
    loads, as :func:`check_model` checks the model's, and against ``queries`` (one must be of
    a benchmark its paper grades with a judge): the :class:`evaluators.judge.HFJudge`
    keyword arguments (``max_new_tokens`` and ``batch_size`` beside the loading ones)."""
    from .judge import JUDGED_BENCHMARKS
    from .model import ModelSpecError, check_model_args, resolve_model

    if args.judge is None:
        if args.judge_args or args.judge_batch_size is not None:
            parser.error("--judge_args / --judge_batch_size without --judge")
        return {}
    if not any(q.benchmark in JUDGED_BENCHMARKS for q in queries):
        parser.error(f"--judge: nothing here is graded by a judge in its paper (only {', '.join(JUDGED_BENCHMARKS)} "
                     "is; the others grade by rule)")
    try:
        resolve_model(args.judge)
    except ModelSpecError as err:
        parser.error(f"--judge: {err}")
    try:
        judge_args = parse_kv(args.judge_args)
        loading = {k: v for k, v in judge_args.items() if k != "max_new_tokens"}
        check_model_args(loading)
    except ValueError as err:
        parser.error(f"--judge_args: {err}")
    if "max_new_tokens" in judge_args and not (isinstance(judge_args["max_new_tokens"], int)
                                               and judge_args["max_new_tokens"] >= 1):
        parser.error(f"--judge_args: max_new_tokens must be an integer >= 1, got {judge_args['max_new_tokens']!r}")
    return {**judge_args, "batch_size": args.judge_batch_size or 8}


def load_judge(parser: argparse.ArgumentParser, spec: str, judge_args: dict[str, Any]):
    """``HFJudge(spec, **judge_args)``; a model that cannot be loaded as a judge is a
    one-line usage error."""
    from .judge import HFJudge
    from .model import ModelSpecError

    try:
        return HFJudge(spec, **judge_args)
    except (ModelSpecError, ValueError) as err:
        parser.error(f"--judge: {err}")


def load_model(parser: argparse.ArgumentParser, spec: str, model_args: dict[str, Any]):
    """``load_hf(spec, **model_args)``; a model that cannot be found is a one-line usage error."""
    from . import model as model_module

    try:
        return model_module.load_hf(spec, **model_args)
    except model_module.ModelSpecError as err:
        parser.error(f"--model: {err}")


def check_positive(parser: argparse.ArgumentParser, **flags: int | None) -> None:
    """Each ``--flag`` given (not None) must be at least 1 (``--seed`` at least 0)."""
    for flag, value in flags.items():
        low = 0 if flag == "seed" else 1
        if value is not None and value < low:
            what = "a non-negative integer" if low == 0 else "a positive integer"
            parser.error(f"--{flag} must be {what}, got {value}")


def add_grounding_arguments(parser: argparse.ArgumentParser) -> None:
    """``--grounding_format`` and ``--box_frame``: how HalluSegBench asks the model for a box,
    and the coordinate frame it writes boxes in."""
    from .box_frames import BOX_FRAMES
    from .grounding_formats import GROUNDING_FORMATS

    parser.add_argument("--grounding_format", default=None, choices=sorted(GROUNDING_FORMATS),
                        help="how a HalluSegBench query asks the model for a box (evaluators/grounding_formats.py); "
                             "default: its family's (Qwen2-VL, Qwen2.5-VL, Qwen3-VL / Qwen3.5, InternVL, PaliGemma), "
                             "else the toolkit's own 'where is the dog ?'")
    parser.add_argument("--box_frame", default=None, choices=sorted(BOX_FRAMES),
                        help="the frame the model writes boxes in (evaluators/box_frames.py); default: its family's "
                             "(relative_1000 for Qwen2-VL / Qwen3-VL / InternVL / GLM-4.xV), else the grounding "
                             "format's, else pixels")


def output_path_wording(err: Exception) -> str:
    """A refusal to resume, in the flag's words (the runner calls the folder ``output_dir``)."""
    return re.sub(r"\boutput_dir\b", "--output_path", str(err))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlm-eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="organism", help="'organism' or an HF model id / path")
    parser.add_argument("--model_args", default="",
                        help="attn_implementation=...,dtype=bf16|fp16|fp32|auto,device=...,device_map=auto")
    parser.add_argument("--tasks", "--suites", dest="tasks", default=None,
                        help="comma-separated built-in suites ('' for none; default: dobench, none when --data is given)")
    parser.add_argument("--data", default="", help="your data: benchmark=path[,benchmark=path] in native formats")
    parser.add_argument("--mitigations", default="", help="e.g. vcd:alpha=1;beta=0.1,prior_suppression")
    parser.add_argument("--include", default="",
                        help="comma-separated Python modules or .py files imported first: your own mitigations, "
                             "registered with @mitigate.register, for --mitigations (docs/mitigations.md)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None,
                        help="first N queries of each suite or data file, completed to whole samples (an image "
                             "pair, a scene group), so no metric reads a partial one")
    parser.add_argument("--scale", default="full", choices=sorted(SCALES),
                        help="built-in suite sizes (evaluators/benchmarks/suites.py); default: full "
                             "(vlm-report's default is small)")
    parser.add_argument("--output_path", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_new_tokens", type=int, default=8,
                        help="new tokens per answer (default 8); a HalluSegBench box gets at least what its "
                             "grounding format needs (evaluators/grounding_formats.py: 8-64)")
    parser.add_argument("--gen_kwargs", default="", help="generate() arguments, e.g. do_sample=true,temperature=1")
    add_grounding_arguments(parser)
    add_judge_arguments(parser)
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:  # 0 read as "no limit", -3 as "all but the last 3"
        parser.error(f"--limit must be a positive number of queries, got {args.limit}")
    check_positive(parser, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, seed=args.seed,
                   judge_batch_size=args.judge_batch_size)

    import torch

    from . import distributed
    from .model import HFModel, check_generate_kwargs
    from .folder_lock import FolderBusy
    from .runner import RunMismatch, run, summary_line

    from .benchmarks.suites import build_suite, chosen_tasks

    try:  # every flag is checked before the model loads: a usage error, not a traceback
        include(args.include)
        tasks = chosen_tasks(args.tasks, args.data, "dobench")
        model_args = parse_kv(args.model_args, "--model_args")
        gen_kwargs, data = parse_kv(args.gen_kwargs, "--gen_kwargs"), parse_kv(args.data, "--data", "benchmark=path")
        check_mitigations(args.mitigations)
    except ValueError as err:
        parser.error(str(err))
    check_model(parser, args.model, model_args)
    if "max_new_tokens" in gen_kwargs:  # generate() would get it twice
        parser.error("--gen_kwargs: give max_new_tokens as --max_new_tokens")
    try:
        check_generate_kwargs(gen_kwargs)
    except ValueError as err:
        parser.error(f"--gen_kwargs: {err}")
    from .query import first_units, repeated_ids

    queries = []  # the data too is read before the model loads: a bad file is a message, at once
    for task in tasks:
        built = build_suite(task, args.seed, args.scale)
        queries += built if args.limit is None else first_units(built, args.limit)
    from .benchmarks.protocols import load_data

    for bench, path in data.items():
        try:
            loaded = load_data({bench: path})
        except ValueError as err:
            parser.error(str(err))
        queries += loaded if args.limit is None else first_units(loaded, args.limit)
    if not queries:
        parser.error("nothing to evaluate: give --tasks and/or --data")
    if twice := repeated_ids(queries):
        parser.error(f"{len(twice)} query ids occur more than once (ids must be unique across --tasks and --data), "
                     f"e.g. {twice[:3]}")
    judge_args = judge_options(parser, args, queries)
    ranks = distributed.init()  # one process, or this rank of an accelerate / torchrun launch
    torch.manual_seed(args.seed)
    model, processor = load_model(parser, args.model, distributed.placement(ranks, model_args))
    try:
        mitigations = parse_mitigations(args.mitigations, processor.tokenizer, processor)
    except ValueError as err:  # a value a mitigation refuses once it has the processor
        parser.error(f"--mitigations: {err}")
    under_test = HFModel(model, processor, mitigations=mitigations, max_new_tokens=args.max_new_tokens,
                         generate_kwargs=gen_kwargs, name=args.model, box_frame=args.box_frame,
                         grounding_format=args.grounding_format)
    config = {"tasks": tasks, "data": data, "limit": args.limit,
              "mitigations": args.mitigations,
              "grounding_format": under_test.grounding.name, "box_frame": under_test.box_frame}
    try:
        payload = run(queries, under_test, args.output_path, batch_size=args.batch_size, seed=args.seed,
                      config=config, progress=not args.no_progress, ranks=ranks)
        if args.judge is not None:  # every answer is in: the judge loads only now, on the main
            # process only (it grades there), and the same call merges, grades and scores again
            judge = load_judge(parser, args.judge, judge_args) if ranks.is_main else None
            payload = run(queries, under_test, args.output_path, batch_size=args.batch_size, seed=args.seed,
                          config=config, progress=False, ranks=ranks, judge=judge)
    except (RunMismatch, FolderBusy) as err:
        parser.error(output_path_wording(err))
    distributed.finish(ranks)
    if payload is None:  # not the main process: the main one merged, scored and prints
        return 0
    for bench in payload["results"]:
        print(summary_line(bench, payload))
    for bench, judged in payload.get("judge", {}).get("benchmarks", {}).items():
        both = judged["answers_both_read"]
        agreement = f"{judged['agreement_with_rules']:.1f}% over {both}" if both else "not measured: no"
        print(f"{bench}: {judged['judged']} answers graded by the judge ({judged['unreadable_verdicts']} replies "
              f"without a verdict; agreement with the rules {agreement} answers both read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
