"""Hooks and ``torch.compile``: a compiled graph does not see hooks added after it.

TorchDynamo does not guard on module hooks (``torch._dynamo.config.skip_nnmodule_hook_guards``
is True by default; its own comment: "if your model actually has hooks and you remove them,
or doesn't and you add them, dynamo will not notice and will execute whichever version you
first compiled"). And ``generate()`` compiles the model's forward by itself for its
decoding steps when the cache is compileable (``cache_implementation="static"``, or a
generation config that asks for one) on an accelerator
(``GenerationMixin._valid_auto_compile_criteria``, transformers 5.20-5.24).

So on a GPU, a plain static-cache ``generate()`` followed by ``attach(model, ...)`` decoded
with the graph compiled before the hooks existed. Measured (session 32, tests/test_cuda.py on
an H100, reproduced on the CPU with ``CompileConfig(backend="eager")``): context-mode prior
suppression's decoding-step scores were 0.02 off the uncompiled ones, silently. Two guards:

* :class:`NoAutoCompile`, owned by a :class:`~hooks.HookGroup`: while any holder is alive,
  ``generate()`` runs its steps uncompiled (a static cache still works, only not compiled;
  a ``RuntimeWarning`` says so when compilation would have happened). Holders count, so
  handles attached to one model can be detached in any order; the last one restores the
  instance exactly.
* :func:`refuse_compiled`: a model with a compiled module in it (``torch.compile(module)``,
  ``module.compile()``, a ``forward`` replaced by ``torch.compile(module.forward)``) is
  refused, since its graph may already be traced without the hooks about to be added. Our
  choice over recompiling: hooks that keep Python-side per-step state (contrast-branch
  caches, per-forward memos) are not written to be traced. (``torch.compiler.disable``
  wrappers are not compiled and pass.)

Not guarded: compiling a module *while* hooks are on it (``model.compile()`` after
``attach()``). Such a graph traces the hooks and keeps running them after they are removed;
compile before attaching (refused, above) or after detaching.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

_ATTRIBUTE = "_valid_auto_compile_criteria"
_MISSING = object()


def compiled_modules(model: nn.Module) -> list[str]:
    """Names (``""`` for the model itself) of the modules of ``model`` that run compiled."""
    from torch._dynamo.eval_frame import DisableContext, OptimizedModule

    found = []
    for name, module in model.named_modules():
        forward = vars(module).get("forward")
        wrapped = isinstance(module, OptimizedModule) and not isinstance(module.dynamo_ctx, DisableContext)
        # torch.compiler.disable wraps a forward the same way, to keep it out of compilation
        replaced = hasattr(forward, "_torchdynamo_orig_callable") and not getattr(forward, "_torchdynamo_disable", False)
        if wrapped or replaced or getattr(module, "_compiled_call_impl", None) is not None:
            found.append(name)
    return found


def refuse_compiled(model: nn.Module) -> None:
    """Raise a ``ValueError`` naming the compiled modules of ``model``, if it has any."""
    found = compiled_modules(model)
    if found:
        names = ", ".join(repr(n or type(model).__name__) for n in found[:5]) + (" ..." if len(found) > 5 else "")
        raise ValueError(
            f"model: {names} run(s) compiled by torch.compile, and a compiled graph does not see hooks added after "
            "it was traced (torch._dynamo.config.skip_nnmodule_hook_guards), so the mitigation would silently not "
            "apply; attach to the uncompiled model (for torch.compile(m), its ._orig_mod)")


class _Uncompiled:
    """The instance's stand-in for ``_valid_auto_compile_criteria``: never compile."""

    def __init__(self, model: nn.Module) -> None:
        self.original = getattr(model, _ATTRIBUTE)
        self.previous = vars(model).get(_ATTRIBUTE, _MISSING)
        self.holders = 0

    def __call__(self, model_kwargs: dict, generation_config: Any) -> bool:
        if self.original(model_kwargs, generation_config):
            warnings.warn(
                "generate() would compile the forward (a compileable cache on an accelerator) but runs it "
                "uncompiled while hooks are attached: a compiled graph does not see hooks added or removed after "
                "tracing (see hooks.compiled)", RuntimeWarning, stacklevel=3)
        return False


class NoAutoCompile:
    """A handle: ``generate()`` does not compile ``model``'s forward until every holder is removed."""

    def __init__(self, model: nn.Module) -> None:
        if not self.applies_to(model):
            raise ValueError(f"{type(model).__name__} has no generate() auto-compilation to switch off")
        current = vars(model).get(_ATTRIBUTE)
        if isinstance(current, _Uncompiled):
            self.stand_in = current
        else:
            self.stand_in = _Uncompiled(model)
            setattr(model, _ATTRIBUTE, self.stand_in)
        self.stand_in.holders += 1
        self.model = model
        self._removed = False

    def remove(self) -> None:
        if self._removed:
            return
        stand_in = self.stand_in
        if stand_in.holders == 1:
            if vars(self.model).get(_ATTRIBUTE) is not stand_in:
                raise RuntimeError(f"{type(self.model).__name__}.{_ATTRIBUTE} was replaced after it was switched off; "
                                   "remove the later patch first")
            if stand_in.previous is _MISSING:
                vars(self.model).pop(_ATTRIBUTE, None)
            else:
                setattr(self.model, _ATTRIBUTE, stand_in.previous)
        stand_in.holders -= 1
        self._removed = True

    @staticmethod
    def applies_to(model: nn.Module) -> bool:
        """Whether ``model``'s ``generate()`` can compile its forward (a transformers generation model)."""
        return callable(getattr(model, _ATTRIBUTE, None))
