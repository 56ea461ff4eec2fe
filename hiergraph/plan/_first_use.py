"""The parts of a plan that only some paths read, built on first use, and what
``torch.compile`` needs of them."""

from __future__ import annotations

import torch

from hiergraph.plan._inference_mode import outside_inference_mode


class built_on_first_use:  # noqa: N801 (a decorator, like functools.cached_property)
    """A part of a plan that only some paths read, built by the decorated method on first
    read and then kept in the plan's ``__dict__`` (as :func:`functools.cached_property`
    does). It is built outside ``torch.inference_mode()``
    (:func:`~hiergraph.plan._inference_mode.outside_inference_mode`) and refused while
    ``torch.compile`` traces, with what to do: building it reads the plan's tensors on the
    host. A plan from :meth:`~hiergraph.data.SignalHierarchy.tree_index` holds every such
    part (:meth:`~hiergraph.plan.TreeIndex.complete`)."""

    def __init__(self, build):
        self.build = outside_inference_mode(build)
        self.name = build.__name__
        self.__doc__ = build.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, plan, owner=None):
        if plan is None:
            return self
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"the plan's {self.name} is built on the host on first use and cannot be "
                "traced: call hierarchy.tree_index() (or TreeIndex.complete()) once before "
                "torch.compile traces the model"
            )
        value = vars(plan)[self.name] = self.build(plan)
        return value
