"""Module entries on live models: the replacement ``ModelNew`` and the guarded ``forward``.

A module entry replaces ``forward`` of the module at the entry's module path whose class matches
(:meth:`~modulelens.dispatch.runtime.PackRuntime.patch_model`); the replacement ``ModelNew`` is
built with the captured constructor arguments and shares the live module's parameters and buffers
(so training updates reach both).

A module entry and the operator entries inside it never both fire on one call: while the
replacement's forward runs, operator dispatch is off; in backward, operators run by the entry's own
backward (the backward of an ``autograd.Function`` its source defines) are not dispatched either,
and when its gradients come from autograd over the operators its forward ran, the autograd nodes
its forward created are marked (a pre- and post-hook each) so that backward operator entries stay
off while they run. Hits are counted per phase: a forward call, and a backward pass through the
entry's own backward (once per forward call and backward pass, whichever of its own nodes runs first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from modulelens.capture import tensors_in
from modulelens.dispatch.pack import PackEntry


class ModuleReplacement:
    """A module entry on one live module: a ``ModelNew`` sharing the module's parameters."""

    def __init__(self, cls: type, entry: PackEntry, tensors: dict[str, torch.Tensor]):
        self.cls, self.entry, self.tensors = cls, entry, tensors

    def build(self, live: torch.nn.Module) -> torch.nn.Module:
        """Construct ``ModelNew`` and give it ``live``'s parameters. The RNG state is restored
        afterwards: initialising the new module's (discarded) weights must not shift the
        random numbers the user's run draws next (dropout masks, data)."""
        from modulelens.capture import rng_states, set_rng_states
        from modulelens.kernels import construct

        init = self.entry.init
        assert init is not None
        state = rng_states()
        try:
            new = construct(self.cls, init.args, init.kwargs, self.tensors, init.sys_path)
        finally:
            set_rng_states(state)
        share_state(new, live)
        return new.train(live.training)


def share_state(new: torch.nn.Module, live: torch.nn.Module) -> None:
    """Make ``new``'s parameters and buffers the very tensors of ``live`` (same names required)."""
    own = dict(live.named_parameters(remove_duplicate=False)) | dict(live.named_buffers(remove_duplicate=False))
    names = [n for n, _ in new.named_parameters(remove_duplicate=False)] + [n for n, _ in new.named_buffers(remove_duplicate=False)]
    missing = sorted(set(names) - set(own))
    if missing:
        raise ValueError(f"ModelNew has parameters the module does not: {', '.join(missing[:5])}")
    for name in names:
        owner_path, _, leaf = name.rpartition(".")
        owner = new.get_submodule(owner_path) if owner_path else new
        value = own[name]
        if isinstance(value, torch.nn.Parameter):
            owner._parameters[leaf] = value
        else:
            owner._buffers[leaf] = value


def own_backward_node(node: Any, source_module: str) -> bool:
    """Whether autograd ``node`` is the backward of an ``autograd.Function`` defined in the
    module entry's source (loaded as module ``source_module``)."""
    cls = getattr(node, "_forward_cls", None)
    return cls is not None and getattr(cls, "__module__", None) == source_module


def own_backward_nodes(outputs: list[torch.Tensor], inputs: list[torch.Tensor], source_module: str) -> list[Any]:
    """The backward nodes of the entry's own ``autograd.Function`` s among the nodes its forward
    created (between ``outputs`` and ``inputs``), wherever they are: a library matrix product or a
    reshape after its own function leaves the output's ``grad_fn`` an aten node."""
    return [node for node in nodes_between(outputs, inputs) if own_backward_node(node, source_module)]


def nodes_between(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> Iterator[Any]:
    """Each autograd node once, from the ``grad_fn`` s of ``outputs`` back to (not including) those
    of ``inputs`` and the leaves' ``AccumulateGrad``: the nodes a module entry's forward created."""
    stop = {t.grad_fn for t in inputs if t.grad_fn is not None}
    seen: set[Any] = set()
    todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or node in seen or node in stop or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        yield node
        todo.extend(next_node for next_node, _ in node.next_functions)


def count_own_backward(nodes: list[Any], live: Any) -> None:
    """Count one backward hit of ``live`` when the autograd engine first runs one of ``nodes`` (the
    own backward of one forward call) in each backward pass."""
    passes: set[int] = set()

    def hit(grads: Any) -> None:
        task = torch._C._current_graph_task_id()
        if task not in passes:
            passes.add(task)
            live.count("backward")

    for node in nodes:
        node.register_prehook(hit)


def mark_backward_region(outputs: list[torch.Tensor], inputs: list[torch.Tensor], runtime: Any) -> None:
    """Hook every autograd node between ``outputs`` and ``inputs`` (the nodes a module entry's
    forward created) so that operator dispatch is off while each runs in backward."""
    for node in nodes_between(outputs, inputs):
        node.register_prehook(lambda grads: runtime.enter_module())
        node.register_hook(lambda grads_in, grads_out: runtime.leave_module())


def guarded_forward(runtime: Any, module: torch.nn.Module, guarded: Any, repl: ModuleReplacement) -> Callable:
    """The ``forward`` that replaces ``module``'s: the entry's ``ModelNew`` for calls its guard
    admits, the original forward for the others (see the module docstring)."""
    from modulelens.dispatch.patterns import call_key

    original = module.forward
    built: list[torch.nn.Module] = []
    source_module = repl.cls.__module__

    def run(args: tuple, kwargs: dict) -> Callable[[Any], Any]:
        def go(live: Any) -> Any:
            if not built:
                built.append(repl.build(module))
            new = built[0]
            new.training = module.training
            runtime.enter_module()
            try:
                out = new(*args, **kwargs)
            finally:
                runtime.leave_module()
            if torch.is_grad_enabled():
                outs = [t for t in tensors_in(out) if t.grad_fn is not None]
                inputs = tensors_in((args, kwargs))
                count_own_backward(own_backward_nodes(outs, inputs, source_module), live)
                if outs and runtime.has_backward_op_entries:
                    mark_backward_region(outs, inputs, runtime)
            return out
        return go

    def forward(*args: Any, **kwargs: Any) -> Any:
        if runtime.paused:
            return original(*args, **kwargs)
        return guarded.call(call_key(args, kwargs, training=module.training), run(args, kwargs),
                            lambda: original(*args, **kwargs))

    forward.__modulelens_pack__ = True  # type: ignore[attr-defined]
    forward.__modulelens_source__ = source_module  # type: ignore[attr-defined]
    return forward
