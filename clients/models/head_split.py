"""A plain ``nn.Module`` split into a representation and a head by naming its head: :func:`split_at`.

MOON's contrastive loss and FedProto's prototypes read the representation ``z`` (the
input of the classifier); a registered model derives from :class:`SplitModel` and
defines ``features``/``classify``. An app's own network, written as Flower's examples
write theirs (modules in ``__init__``, any ``forward``), needs neither: naming the module
applied last is enough. ``z`` is what that module receives in one forward pass, read by
a forward pre-hook, so the network's ``forward`` stays its own and its ``state_dict``
names stay the same.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from clients.models.split import SplitModel


class HeadSplit(SplitModel):
    """The methods a network gets from :func:`split_at`; never built directly."""

    head_prefix: str
    _plain_forward = nn.Module.forward  # the network's own forward, set per class by _split_class

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x, with_features=True)[1]

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.get_submodule(self.head_prefix)(z)

    def forward(self, x: torch.Tensor, with_features: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not with_features:  # no hook: torch.fx traces the network's own forward (clients.models.traits)
            return self._plain_forward(x)
        head = self.get_submodule(self.head_prefix)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        handle = head.register_forward_hook(lambda module, args, output: seen.append((args[0], output)))
        try:
            output = self._plain_forward(x)
        finally:
            handle.remove()
        if len(seen) != 1 or seen[0][1] is not output:
            raise RuntimeError(
                f"split_at(head={self.head_prefix!r}): {type(self).__name__}.forward must return the output of "
                f"{self.head_prefix!r}, called once, as is (it was called {len(seen)} times"
                f"{'' if len(seen) != 1 else ', and its output was changed after'}); name the layer applied last"
            )
        return output, seen[0][0]


@cache
def _split_class(network_class: type[nn.Module]) -> type[HeadSplit]:
    # the network's class first after HeadSplit's: its attributes and methods stay; its forward is called as is
    return type(network_class.__name__, (HeadSplit, network_class),
                {"__module__": network_class.__module__, "__qualname__": network_class.__qualname__,
                 "_plain_forward": network_class.forward})  # fmt: skip


def split_at(network: nn.Module, *, head: str) -> nn.Module:
    """``network`` itself, now also a :class:`SplitModel` whose head is its submodule ``head``.

    ``features(x)`` is what ``head`` receives in a forward pass and ``classify(z)`` is
    ``head(z)``; the arrays under ``head.`` are the head's (FedRep, FedPer and MOON read
    them). Its ``state_dict`` names, attributes and ``forward`` are unchanged; a forward
    pass must return the output of ``head``, called once, as is (checked on every pass
    that reads the representation). Use it in the app's model function:
    ``model=lambda config: split_at(Net(), head="fc3")``.

    Raises
    ------
    ValueError
        If ``network`` already has the split, or ``head`` names no submodule with arrays.

    """
    if isinstance(network, SplitModel):
        raise ValueError(f"{type(network).__name__} is split already (a SplitModel): use it as it is")
    modules = dict(network.named_modules())
    if not head or head not in modules:
        names = [name for name, module in modules.items() if name and next(module.children(), None) is None]
        raise ValueError(f"split_at: {type(network).__name__} has no submodule {head!r}; its layers: {names}")
    if not any(True for _ in modules[head].parameters()):
        raise ValueError(f"split_at: {type(network).__name__}.{head} has no arrays; name the classifier layer")
    network.__class__ = _split_class(type(network))
    network.head_prefix = head
    return network
