"""A group of forward hooks whose handles it owns, and removes exactly.

PyTorch's ``register_forward_hook`` returns a :class:`~torch.utils.hooks.RemovableHandle`;
removing that handle removes that hook and nothing else. A :class:`HookGroup` keeps
every handle it created and removes all of them when it is closed -- in a ``finally``
block, so also when the code inside the ``with`` raises. It never clears hook
dictionaries wholesale (unlike ``_forward_hooks.clear()``), so hooks registered by
accelerate (``device_map="auto"``), by the user, or by another group keep firing.

Example::

    from hooks import HookGroup, resolve

    points = resolve(model)
    seen = []
    with HookGroup() as group:
        group.add_forward_hook(points.projector, lambda m, args, kwargs, out: seen.append(out.shape))
        model(**inputs)
    # every hook the group added is gone here, even if model(...) raised
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

from torch import nn
from torch.utils.hooks import RemovableHandle

_MISSING = object()
# every group holding handles, so that code can ask which groups act on a model (groups_on)
_LIVE: "weakref.WeakSet[HookGroup]" = weakref.WeakSet()

# The per-module dictionaries a hook registration may write to. Used by tests and by
# :func:`hook_state` to prove that removal restores a model exactly.
HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)


def hook_state(model: nn.Module) -> dict[str, dict[str, tuple]]:
    """Snapshot of every hook dictionary of every submodule (keys only, in order).

    Two snapshots compare equal exactly when the same hooks are registered, in the same
    order, on the same modules, and the same instance-level method overrides are in place.
    """
    state: dict[str, dict[str, tuple]] = {}
    for name, module in model.named_modules():
        state[name] = {attr: tuple(getattr(module, attr, {}).keys()) for attr in HOOK_DICTS}
        # instance attributes that shadow a method of the class (HookGroup.patch_attribute,
        # accelerate's forward wrapper): their identities, so a leftover patch shows
        state[name]["method_overrides"] = tuple(
            (key, id(value)) for key, value in sorted(vars(module).items())
            if callable(getattr(type(module), key, None)) and not isinstance(value, nn.Module)
        )
    return state


class HookGroup:
    """Registers forward / pre-forward hooks and removes exactly the ones it created.

    Use as a context manager (hooks are removed on exit, also on an exception), or call
    :meth:`remove` explicitly. A removed group can be reused: new registrations start a
    new set of handles. A group whose ``with`` block has ended refuses registrations until
    it is entered again: nothing would remove a hook added after its block.

    Hook signatures are PyTorch's, always with keyword arguments:

    * pre-forward: ``fn(module, args, kwargs) -> None | (new_args, new_kwargs)``
    * forward: ``fn(module, args, kwargs, output) -> None | new_output``
    """

    def __init__(self, name: str = "hooks") -> None:
        self.name = name
        self._handles: list[Any] = []  # RemovableHandle | AttributePatch | NoAutoCompile | RemovalCallback
        self._closed = False  # its with-block has ended

    def _own(self, handle: Any) -> Any:
        self._handles.append(handle)
        _LIVE.add(self)
        return handle

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: this group's with-block has ended, so nothing would remove a hook "
                               "added now; register inside the block, enter the group again, or use a new HookGroup")

    # -- registration -----------------------------------------------------------------
    def add_forward_pre_hook(self, module: nn.Module, fn: Callable, *, prepend: bool = False):
        """Run ``fn(module, args, kwargs)`` before ``module.forward``; it may return new ``(args, kwargs)``."""
        self._check_open()
        _check_module(module, fn)
        return self._own(module.register_forward_pre_hook(fn, with_kwargs=True, prepend=prepend))

    def add_forward_hook(
        self, module: nn.Module, fn: Callable, *, prepend: bool = False, always_call: bool = False
    ):
        """Run ``fn(module, args, kwargs, output)`` after ``module.forward``; it may return a new output."""
        self._check_open()
        _check_module(module, fn)
        return self._own(module.register_forward_hook(fn, with_kwargs=True, prepend=prepend, always_call=always_call))

    def add_many(self, modules: Iterable[nn.Module], fn_for: Callable[[int, nn.Module], Callable], *, pre: bool):
        """Register one hook per module; ``fn_for(index, module)`` builds each hook function."""
        register = self.add_forward_pre_hook if pre else self.add_forward_hook
        return [register(module, fn_for(i, module)) for i, module in enumerate(modules)]

    def patch_attribute(self, owner: Any, name: str, value: Any) -> "AttributePatch":
        """Set ``owner.<name> = value`` on this instance until the group is removed.

        For the few entry points that are methods, not modules -- ``generate()`` calls
        ``model.base_model.get_image_features`` before its decoding loop, where no forward
        hook can see the pixels. Removal restores the instance exactly: the attribute is
        deleted again if the instance did not have its own, else the previous value is put
        back (class attributes are never touched). Patching the same attribute twice in one
        group is refused.
        """
        self._check_open()
        if not name.isidentifier():
            raise ValueError(f"attribute name must be an identifier, got {name!r}")
        if any(isinstance(h, AttributePatch) and h.owner is owner and h.name == name for h in self._handles):
            raise ValueError(f"{self.name}: {type(owner).__name__}.{name} is already patched by this group")
        return self._own(AttributePatch(owner, name, value))

    def patched(self, owner: Any, name: str) -> Any:
        """The value this group put on ``owner.<name>`` (:meth:`patch_attribute`) while it is
        still there, else None."""
        for h in self._handles:
            if isinstance(h, AttributePatch) and h.owner is owner and h.name == name and not h._removed:
                return h.value
        return None

    def keep_generate_uncompiled(self, model: nn.Module):
        """Until the group is removed, ``model.generate()`` runs its decoding steps uncompiled,
        and a model with a compiled module is refused (``ValueError``): a compiled graph does
        not see hooks added after it was traced (:mod:`hooks.compiled`). Returns the handle,
        or None for a model without ``generate()``'s auto-compilation."""
        from .compiled import NoAutoCompile, refuse_compiled

        self._check_open()
        refuse_compiled(model)
        if not NoAutoCompile.applies_to(model):
            return None
        return self._own(NoAutoCompile(model))

    def on_remove(self, fn: Callable[[], None]) -> "RemovalCallback":
        """Call ``fn()`` once when the group is removed, in reverse order of registration
        like the hooks -- for state a hook leaves behind outside the model (contrast
        branches cut the rows they added to the last call's KV cache)."""
        self._check_open()
        return self._own(RemovalCallback(fn))

    # -- removal ----------------------------------------------------------------------
    def remove(self) -> None:
        """Remove every hook this group registered (idempotent). Hooks of others are untouched."""
        handles, self._handles = self._handles, []
        errors, kept = [], []
        for handle in reversed(handles):
            try:
                handle.remove()
            except Exception as exc:  # an attribute patch replaced by someone else since
                errors.append(exc)
                kept.append(handle)
        self._handles = kept[::-1]  # still owned: a later remove() retries them
        if not self._handles:
            _LIVE.discard(self)
        if errors:
            raise RuntimeError(f"{self.name}: {len(errors)} hook(s) could not be removed: {errors!r}")

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> "HookGroup":
        self._closed = False
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._closed = True
        if exc is None:
            self.remove()
            return
        try:  # the user's exception is what leaves the block; a removal problem is a warning
            self.remove()
        except RuntimeError as err:
            import warnings

            warnings.warn(f"{err} (while {exc_type.__name__} left the block; the group keeps those hooks: "
                          "remove() retries them)", RuntimeWarning, stacklevel=2)

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` and remove this group's hooks afterwards, whatever happens."""
        try:
            return fn(*args, **kwargs)
        finally:
            self.remove()

    def __repr__(self) -> str:
        return f"HookGroup(name={self.name!r}, hooks={len(self._handles)})"


def groups_on(model: nn.Module) -> list[HookGroup]:
    """The live groups with a forward or pre-forward hook on ``model`` or one of its
    submodules -- e.g. attached mitigations that act on a forward (attribute patches, such
    as crop-and-verify's ``generate()``, are not counted). Hooks registered outside any
    group (transformers' own output recorders, accelerate's, the user's) are not seen, nor
    are the hooks of a group nobody holds any more (a mitigation handle dropped without
    ``detach()``: its hooks stay on the model, out of reach -- detach what you attach)."""
    dicts = {id(getattr(m, name)) for m in model.modules() for name in ("_forward_hooks", "_forward_pre_hooks")}
    found = []
    for group in list(_LIVE):
        for handle in group._handles:
            ref = handle.hooks_dict_ref() if isinstance(handle, RemovableHandle) else None
            if ref is not None and id(ref) in dicts and handle.id in ref:
                found.append(group)
                break
    return found


class RemovalCallback:
    """An owned callback run once by :meth:`HookGroup.remove`."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self._removed = False

    def remove(self) -> None:
        if self._removed:
            return
        self.fn()
        self._removed = True


class AttributePatch:
    """An owned instance-attribute override; ``remove()`` restores the instance exactly."""

    def __init__(self, owner: Any, name: str, value: Any) -> None:
        self.owner, self.name, self.value = owner, name, value
        self._previous = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)
        self._removed = False

    def remove(self) -> None:
        if self._removed:
            return
        current = vars(self.owner).get(self.name, _MISSING)
        if current is not self.value:
            # someone patched the same attribute after us and has not restored it yet:
            # restoring ours now would put their value back forever after
            raise RuntimeError(
                f"{type(self.owner).__name__}.{self.name} was replaced after this patch; remove the later "
                "patch first (detach mitigations in the reverse order of attaching)"
            )
        self._removed = True
        if self._previous is _MISSING:
            vars(self.owner).pop(self.name, None)
        else:
            setattr(self.owner, self.name, self._previous)


def _check_module(module: Any, fn: Any) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected a torch.nn.Module to hook, got {type(module).__name__}")
    if not callable(fn):
        raise TypeError(f"hook function must be callable, got {type(fn).__name__}")
