"""One way to use every mitigation: ``attach(model, *mitigations)``.

    handle = attach(model, VCD(alpha=1.0))
    out = model.generate(**inputs)          # mitigated
    handle.detach()                         # the model is exactly as before

    with attach(model, VCD()) as handle:    # or as a context manager
        out = model.generate(**inputs)

A mitigation is a validated config plus the hooks it registers. Mitigations that need
contrast branches declare them (:meth:`Mitigation.branches`) and a logits combination
(:meth:`Mitigation.combine`); :func:`attach` runs all declared branches in one batch
expansion and applies the combinations in the order the mitigations were given; hooks a
mitigation adds itself (:meth:`Mitigation.attach_hooks`: the plausibility cut, an attention
bias) act on the forward's combined output, whatever the mitigation's place in the list.
Everything is registered through one :class:`hooks.HookGroup`, so ``detach()`` removes
exactly what was added. While attached, ``generate()`` does not compile the forward (it
would for a static cache on a GPU, and a compiled graph does not see hooks added after it:
:mod:`hooks.compiled`), and a model with a compiled module is refused. ``generate()`` calls on an attached model run
one at a time (:class:`OneCallAtATime`): the mitigations keep per-call state on the model
(the last prompt's cache and spans), so two threads generating at once -- a web server's
thread pool -- would read each other's; the second call waits for the first.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch
from torch import nn

from hooks import HookGroup, ModelPoints, resolve
from hooks.compiled import refuse_compiled
from hooks.errors import unknown

from .branches import Branch, ContrastBranches

MITIGATIONS: dict[str, type["Mitigation"]] = {}
_MISSING = object()
#: guards the per-model registry of handles and the shared continuous-batching refusal
#: against attach() / detach() from several threads at once
_REGISTRY_LOCK = threading.RLock()

#: a mitigation's dataclass field ``metadata`` key: the field is left out of the repr (too
#: long to print: a chat template, per-row prompt texts) but the answers depend on it, so a
#: run's recorded identity carries a digest of its value
#: (``field(default=None, repr=False, metadata={IDENTITY_DIGEST: True})``;
#: ``evaluators.model.stable_repr`` reads it)
IDENTITY_DIGEST = "identity_digest"


def register(cls: type["Mitigation"]) -> type["Mitigation"]:
    """Class decorator: make a mitigation available by name (``get_mitigation("vcd")``).

    ``cls`` must be a :class:`Mitigation` subclass that sets its own ``name`` and is a
    ``@dataclass`` (apply ``@register`` above ``@dataclass``): its fields are its settings,
    which the command line fills by name (``--mitigations name:key=value``) and a run records
    by its repr. A class redefined under the same module and name (a notebook cell run
    again) replaces the earlier one; another class under a taken name is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Mitigation)):
        raise TypeError(f"register() takes a Mitigation subclass, got {cls!r}")
    if "name" not in vars(cls) or not isinstance(cls.name, str) or not cls.name:
        raise ValueError(f"{cls.__name__} must set its own name (name = \"my_mitigation\"), the name the command "
                         f"line and get_mitigation() know it by; it inherits {cls.name!r}")
    if "__dataclass_fields__" not in vars(cls):  # a subclass of one without @dataclass: its new fields are no settings
        raise TypeError(f"{cls.__name__} must be a @dataclass (put @register above @dataclass): its fields are the "
                        "settings --mitigations fills by name and a run records")
    taken = MITIGATIONS.get(cls.name)
    if taken is not None and taken is not cls and (taken.__module__, taken.__qualname__) != (cls.__module__,
                                                                                              cls.__qualname__):
        raise ValueError(f"a mitigation named {cls.name!r} is registered already ({taken.__module__}."
                         f"{taken.__qualname__})")
    MITIGATIONS[cls.name] = cls
    return cls


def get_mitigation(name: str) -> type["Mitigation"]:
    try:
        return MITIGATIONS[name]
    except KeyError:
        raise KeyError(unknown("mitigation", name, MITIGATIONS)) from None


class Mitigation:
    """Base class. Subclasses set ``name`` and override the hooks they need."""

    name = "mitigation"
    #: extra forward rows per original row (for cost reports): the number of branches
    extra_rows = 0
    #: at most one of this class per attach(): it takes over generate() itself
    one_per_attach = False
    #: whether it runs under continuous batching (``cache_implementation="paged"``,
    #: ``generate_batch()``), whose cache packs every request into one row. A mitigation with
    #: contrast branches never does; where any attached one does not, attach() makes
    #: ``model.init_continuous_batching`` raise the ValueError in the caller's thread (inside
    #: the batching thread transformers only logged it and returned the prompts unextended)
    continuous_batching = True

    def branches(self, points: ModelPoints) -> list[Branch]:
        return []

    def combine(self, logits: torch.Tensor, branch_logits: Sequence[torch.Tensor]) -> torch.Tensor:
        return logits

    def attach_hooks(self, points: ModelPoints, group: HookGroup) -> None:
        """Register hooks that are not contrast branches (attention biases, ...)."""

    def validate(self, points: ModelPoints) -> None:
        """Raise a clear error if this mitigation cannot run on this model."""

    def conflict(self, other: "Mitigation") -> str | None:
        """Why this mitigation cannot run beside ``other`` on one model (attached by the same
        attach() or another one), or None. attach() asks both ways and refuses with the reason."""
        return None


#: the model's instance attribute listing the handles attached to it (shared by every attach())
_ATTACHED = "_mitigation_handles"


def attached(model: nn.Module) -> list["Mitigation"]:
    """The mitigations attached to ``model`` now, every handle's, in the order attached."""
    return [m for handle in list(getattr(model, "__dict__", {}).get(_ATTACHED, ())) for m in handle.mitigations]


def check_conflicts(mitigations: Sequence["Mitigation"], present: Sequence["Mitigation"] = ()) -> None:
    """A ``ValueError`` naming the first of ``mitigations`` that cannot run beside one of
    ``present`` or one before it (:meth:`Mitigation.conflict`, asked both ways). attach()
    checks it, and so does a mitigation that runs the model itself (``CropVerify.answer``)."""
    for i, m in enumerate(mitigations):
        for other in [*present, *mitigations[:i]]:
            why = m.conflict(other) or other.conflict(m)
            if why:
                raise ValueError(f"{m.name} cannot run beside {other.name}: {why}")


class _RefuseContinuousBatching:
    """The instance's ``init_continuous_batching`` while mitigations that cannot run under
    continuous batching are attached: every path into it (``generate(cache_implementation=
    "paged")``, ``generate_batch()``, ``continuous_batching_context_manager()``) starts here,
    in the caller's thread."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous  # the instance's own attribute before the first holder, or _MISSING
        self.holders: list[list[str]] = []  # per attach() holding it: the names of its refusing mitigations

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(n for held in self.holders for n in held))

    @classmethod
    def hold(cls, model: nn.Module, names: Sequence[str], group: HookGroup) -> None:
        """Refuse continuous batching on ``model`` until ``group`` is removed. Every attach()
        holding the refusal shares one, so the handles detach in any order: the last one out
        restores the model's own ``init_continuous_batching``."""
        with _REGISTRY_LOCK:
            current = vars(model).get("init_continuous_batching", _MISSING)
            refusal = current if isinstance(current, cls) else cls(current)
            held = list(names)
            refusal.holders.append(held)
            model.init_continuous_batching = refusal

        def release() -> None:  # idempotent, and changes nothing when it refuses (a detach may be retried)
            with _REGISTRY_LOCK:
                if not any(h is held for h in refusal.holders):
                    return
                last = len(refusal.holders) == 1
                if last and vars(model).get("init_continuous_batching") is not refusal:
                    raise RuntimeError(f"{type(model).__name__}.init_continuous_batching was replaced after attach(); "
                                       "remove the later patch first")
                refusal.holders[:] = [h for h in refusal.holders if h is not held]
                if not last:
                    return
                if refusal.previous is _MISSING:
                    del model.init_continuous_batching
                else:
                    model.init_continuous_batching = refusal.previous

        group.on_remove(release)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(
            f"cache_implementation='paged' (continuous batching, generate_batch()): {', '.join(self.names)} "
            "need(s) each sample in rows of its own and a cache that tells a prompt from a decoding step, and "
            "continuous batching packs every request into one row; use the default dynamic cache or "
            "cache_implementation='static'")


class OneCallAtATime:
    """The instance's ``generate`` while mitigations are attached: the model's own (or a
    mitigation's wrapper of it, :attr:`inner`) under a lock, so that concurrent calls from
    several threads run one after another instead of interleaving their forwards over one
    set of per-call state (each would otherwise fail with an error about another call's
    cache, or read another call's spans). Re-entrant: a call made from inside a call (a
    streamer's callback, say) on the same thread proceeds. Direct forwards
    (``model(**inputs)``) from several threads at once are not serialised."""

    def __init__(self, inner: Callable) -> None:
        self.inner = inner
        self.lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # the wrapped generate's attributes (crop-and-verify's)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __deepcopy__(self, memo: dict) -> "OneCallAtATime":
        # copy.deepcopy(model) while attached: a lock of its own around the copy's generate
        import copy

        return OneCallAtATime(copy.deepcopy(self.inner, memo))


class MitigationHandle:
    """What :func:`attach` returns; ``detach()`` (or leaving the ``with``) removes everything."""

    def _check_conflicts(self) -> None:
        """Refuse a mitigation that cannot run beside another one on this model (either way)."""
        check_conflicts(self.mitigations, attached(self.model))

    def _register(self) -> None:
        """List this handle on the model (:func:`attached`) until it is detached; the last one
        out removes the list."""
        with _REGISTRY_LOCK:
            handles = vars(self.model).get(_ATTACHED)
            if handles is None:
                handles = []
                vars(self.model)[_ATTACHED] = handles  # not nn.Module.__setattr__: a plain list
            handles.append(self)

        def release() -> None:
            with _REGISTRY_LOCK:
                if self in handles:
                    handles.remove(self)
                if not handles and vars(self.model).get(_ATTACHED) is handles:
                    del vars(self.model)[_ATTACHED]

        self.group.on_remove(release)

    def __init__(self, model: nn.Module, mitigations: Sequence[Mitigation], points: ModelPoints) -> None:
        self.model = model
        self.mitigations = tuple(mitigations)
        self.points = points
        self.group = HookGroup("mitigations")
        self.branches: ContrastBranches | None = None

    def _attach(self) -> None:
        try:
            for m in self.mitigations:
                m.validate(self.points)
            self._check_conflicts()
            self._register()
            # generate() compiles its steps by itself for a static cache on a GPU, and a
            # compiled graph would not see these hooks (hooks.compiled)
            self.group.keep_generate_uncompiled(self.model)
            declared = [(m, m.branches(self.points)) for m in self.mitigations]
            refusing = [m.name for m, bs in declared if bs or not m.continuous_batching]
            if refusing and callable(getattr(self.model, "init_continuous_batching", None)):
                _RefuseContinuousBatching.hold(self.model, refusing, self.group)
            if callable(getattr(self.model, "generate", None)) and not isinstance(vars(self.model).get("generate"),
                                                                                  OneCallAtATime):
                # before attach_hooks: a mitigation that wraps generate() itself (crop-and-verify)
                # wraps OneCallAtATime.inner. A model another attach() already locked keeps that
                # lock (a second one would make the two handles' detach order matter)
                self.group.patch_attribute(self.model, "generate", OneCallAtATime(self.model.generate))
            all_branches = [b for _, bs in declared for b in bs]
            if all_branches:
                spans, start = [], 0
                for m, bs in declared:
                    spans.append((m, start, start + len(bs)))
                    start += len(bs)

                def combine(logits, branch_logits):
                    for m, lo, hi in spans:
                        if hi > lo:
                            logits = m.combine(logits, branch_logits[lo:hi])
                    return logits

                self.branches = ContrastBranches(self.points, all_branches, combine)
                self.branches.attach(self.group)
            for m in self.mitigations:
                m.attach_hooks(self.points, self.group)
        except BaseException:
            self.group.remove()
            raise

    @property
    def attached(self) -> bool:
        return self.group.active

    @property
    def rows_per_sample(self) -> int:
        """Forward rows computed per original row: 1 + the number of contrast branches."""
        return 1 + (self.branches.k if self.branches else 0)

    def detach(self) -> None:
        self.group.remove()

    def __enter__(self) -> "MitigationHandle":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # as HookGroup: an exception leaving the block is what the caller sees; a hook that
        # cannot be removed then (patched again by a handle still attached) is a warning,
        # and detach() retries it
        self.group.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        names = ", ".join(m.name for m in self.mitigations)
        return f"MitigationHandle([{names}], attached={self.attached})"


def attach(model: nn.Module, *mitigations: Mitigation) -> MitigationHandle:
    """Attach ``mitigations`` to an unmodified HF VLM; returns a handle (also a context manager)."""
    if not isinstance(model, nn.Module):  # attach(processor, ...) failed on 'named_modules'
        raise TypeError(f"attach() takes the model (a torch.nn.Module, e.g. what AutoModelForImageTextToText "
                        f"loads) first, got {type(model).__name__}; a mitigation that needs the processor takes "
                        "it itself: CropVerify(processor), PriorSuppression(processor.tokenizer)")
    if not mitigations:
        raise ValueError("attach() needs at least one mitigation")
    for m in mitigations:
        if isinstance(m, type) and issubclass(m, Mitigation):
            raise TypeError(f"attach() takes mitigation instances: got the class {m.__name__}, pass {m.__name__}()")
        if not isinstance(m, Mitigation):
            raise TypeError(f"expected Mitigation instances, got {type(m).__name__}")
    twice = [m for i, m in enumerate(mitigations) if any(m is other for other in mitigations[:i])]
    if twice:  # its hooks would act twice on every forward (VCD's contrast applied twice)
        raise ValueError(f"mitigations: {twice[0]!r} is given twice; pass each mitigation once")
    for kind in {type(m) for m in mitigations if m.one_per_attach}:
        if sum(type(m) is kind for m in mitigations) > 1:
            raise ValueError(f"mitigations: {kind.__name__} is given more than once; it takes over generate() "
                             "itself, so one attach() holds one")
    refuse_compiled(model)  # before resolve(): a torch.compile wrapper is named as such
    handle = MitigationHandle(model, mitigations, resolve(model))
    handle._attach()
    return handle
