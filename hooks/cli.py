"""``vlm-hooks``: show where the hook points of a VLM are, and prove they fire.

    vlm-hooks inspect tiny:all                 # every supported architecture, tiny random models
    vlm-hooks inspect tiny:qwen2_vl --attn eager
    vlm-hooks inspect llava-hf/llava-1.5-7b-hf # any HF model id or local path (resolution only)
    vlm-hooks inspect organism                 # the shipped organism (as vlm-eval --model organism)
    vlm-hooks support [MODEL_TYPE ...]         # how every VLM family of the installed transformers resolves

For ``tiny:`` models a forward pass runs with a recording hook on every point and the
shapes each point saw are printed; afterwards the model's hook dictionaries are checked
to be exactly as before.
"""

from __future__ import annotations

import argparse
import sys

from .describe import inspect, trace
from .group import hook_state


def _tiny(model_type: str, attn: str):
    from .testing import build_tiny_model, tiny_inputs

    model = build_tiny_model(model_type, attn_implementation=attn)
    return model, tiny_inputs(model, batch_size=2, text_lengths=[6, 4])


def _inspect_one(spec: str, attn: str) -> None:
    if spec.startswith("tiny:"):
        model, inputs = _tiny(spec.split(":", 1)[1], attn)
    else:
        from transformers import AutoModelForImageTextToText

        from evaluators.model import from_pretrained

        model, inputs = from_pretrained(AutoModelForImageTextToText, spec, attn_implementation=attn), None
    n_params = sum(p.numel() for p in model.parameters())
    print(f"== {spec}  ({type(model).__name__}, {n_params:,} parameters)")
    inspect(model, file=sys.stdout)  # the stdout of now (the default is the one at import)
    if inputs is None:
        return
    before = hook_state(model)
    seen = trace(model, inputs)
    print("fired (shapes, per layer where per-layer):")
    for name, shapes in seen.items():
        shown = shapes[0] if len(set(shapes)) == 1 else shapes
        print(f"  {name:<24} x{len(shapes)}  {shown}")
    clean = hook_state(model) == before
    print(f"hooks removed, model hook state restored: {clean}")
    if not clean:
        raise SystemExit("hook state differs after removal")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlm-hooks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="resolve and print a model's hook points")
    p.add_argument("model", help="HF model id or path, 'organism', 'tiny:<model_type>', or 'tiny:all'")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    s = sub.add_parser("support", help="how each image-text-to-text model type of the installed transformers "
                                       "resolves (its default config, built on the meta device)")
    s.add_argument("model_types", nargs="*", help="model types (default: all of them)")
    args = parser.parse_args(argv)

    if args.command == "support":
        from .support import UnknownModelType, markdown, support_matrix

        try:
            print(markdown(support_matrix(args.model_types or None)))
        except UnknownModelType as error:  # support() says which, with the close matches
            parser.error(str(error))
        return 0
    specs = [args.model]
    if args.model == "tiny:all":
        from .testing import TINY_MODEL_TYPES

        specs = [f"tiny:{t}" for t in TINY_MODEL_TYPES]
    elif args.model.startswith("tiny:"):
        from .testing import TINY_MODEL_TYPES

        if args.model[5:] not in TINY_MODEL_TYPES:
            parser.error(f"no tiny model {args.model!r}; known: tiny:all, "
                         + ", ".join(f"tiny:{t}" for t in TINY_MODEL_TYPES))
    for spec in specs:
        if spec.startswith("tiny:"):
            _inspect_one(spec, args.attn)
        else:
            from evaluators.model import ModelSpecError

            try:
                _inspect_one(spec, args.attn)
            except ModelSpecError as err:  # a missing folder, an id the Hub does not give: one line
                parser.error(f"model: {err}")
        print()
    if args.model == "tiny:all":
        print(f"{len(specs)} architectures resolved and traced: {', '.join(s[5:] for s in specs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
