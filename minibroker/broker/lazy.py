"""``lazy_module``: a module bound at import and executed on its first use (issue 19, lazy imports).

For a module a hot path reads (``dispatch.py``'s Service Bus rules, read per message published to a Service Bus
topic): an import inside the function would run per message, so the module is bound once, as a module the import
system already holds, and runs when an attribute of it is first read. That is importlib's ``LazyLoader``, the
recipe of the importlib documentation ("Implementing lazy imports"); after the first read the object is an ordinary
module, whose reads cost what they did before. Until then ``sys.modules`` holds a ``_LazyModule``
(tests/server/test_lazy_imports.py counts those as not loaded).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """The module ``name``: the loaded one when it is loaded, else one that loads on its first attribute read."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)  # as an import binds it, for ``from parent import child``
    return module
