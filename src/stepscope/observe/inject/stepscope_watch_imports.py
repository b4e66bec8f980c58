"""Post-import hooks: run a function on a module right after its first import finishes.

A meta-path finder sits first on ``sys.meta_path``. For a watched name it asks the finders after
it for the real spec and wraps that spec's loader's ``exec_module`` (on the loader instance, so
``module.__loader__`` stays the real loader and nothing that inspects it sees a stranger). For
any other name it answers None at the cost of one dict lookup, so imports stay as fast as before.
Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

Hook = Callable[[ModuleType], None]


# Not a subclass of importlib.abc.MetaPathFinder: importing importlib.abc pulls in
# importlib.resources, pathlib and tempfile, ~50 ms of start-up for nothing; sys.meta_path only
# needs find_spec.
class PostImportFinder:
    """Calls ``hooks[name](module)`` once ``name`` has been imported; errors go to ``on_error``.

    Examples:
        >>> finder = PostImportFinder({"torch": patch_torch}, on_error=print)
        >>> finder.install()  # modules already imported are patched at once
    """

    def __init__(self, hooks: dict[str, Hook], on_error: Callable[[str, BaseException], None]):
        self._hooks = dict(hooks)
        self._on_error = on_error
        self._busy: set[str] = set()

    def install(self) -> None:
        sys.meta_path.insert(0, self)
        for name in list(self._hooks):
            module = sys.modules.get(name)
            if module is not None:
                self._run(name, module)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self._hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = self._find_real(fullname, path, target)
        finally:
            self._busy.discard(fullname)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            try:
                original(module)
            finally:
                # Back to the class's method: a reload must not run the hook twice.
                loader.__dict__.pop("exec_module", None)
            self._run(fullname, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader with slots: import it unhooked
            return spec
        return spec

    def _find_real(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _run(self, name: str, module: ModuleType) -> None:
        hook = self._hooks.pop(name, None)
        if hook is None:
            return
        try:
            hook(module)
        except Exception as exc:  # a failed patch must never break the user's import
            self._on_error(name, exc)
