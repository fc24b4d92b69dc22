"""Which changes in the watched directories can change what the provider reads.

The provider watches more than its files: the parent of each input, to see
the input itself created or replaced, and the directories holding the files
its kubeconfigs reference. Anything else written there (a log file next to a
kubeconfig directory, an editor's swap file) must not cost a pass over every
file, and must never feed back into itself: a pass that logs a line into a
watched directory would otherwise wake the next pass, forever.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@functools.lru_cache(maxsize=16)
def name_matcher(include: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a name matches any of the globs (case-sensitive): one regex, not a glob at a time."""
    if not include:
        return lambda _name: False
    pattern = re.compile("|".join(fnmatch.translate(glob) for glob in include))
    return lambda name: pattern.match(name) is not None


def _key(path: Path | str) -> str:
    return os.path.abspath(path)


def _with_ancestors(paths: Iterable[Path]) -> set[str]:
    """The paths and every directory above them: creating any of these can bring a path into being."""
    keys: set[str] = set()
    for path in paths:
        key = _key(path)
        while key not in keys:
            keys.add(key)
            parent = os.path.dirname(key)
            if parent == key:
                break
            key = parent
    return keys


@dataclass(frozen=True)
class Interest:
    """What a change must touch to be worth a pass.

    ``exact``: the inputs, the files named directly, and every directory above
    them. ``searched``: directories searched without recursion, where entries
    matching ``include`` count. ``trees``: directories searched recursively,
    where everything below counts. ``everything``: directories where every
    entry counts (those of referenced certificate, key and token files). In
    ``searched`` directories and those of named files, dot entries count too:
    ``..data`` is what a Secret volume swaps.
    """

    exact: frozenset[str] = frozenset()
    searched: frozenset[str] = frozenset()
    named_parents: frozenset[str] = frozenset()
    trees: frozenset[str] = frozenset()
    everything: frozenset[str] = frozenset()
    include: tuple[str, ...] = ()
    _tree_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tree_prefixes", tuple(tree.rstrip(os.sep) + os.sep for tree in self.trees))

    @classmethod
    def of(
        cls,
        *,
        directories: Iterable[Path],
        files: Iterable[Path],
        recursive: bool,
        include: Sequence[str],
    ) -> Interest:
        """The interest of directory inputs searched for ``include`` and of files named directly."""
        directories, files = list(directories), list(files)
        keys = {_key(directory) for directory in directories}
        return cls(
            exact=frozenset(_with_ancestors([*directories, *files])),
            searched=frozenset() if recursive else frozenset(keys),
            named_parents=frozenset(_key(path.parent) for path in files),
            trees=frozenset(keys) if recursive else frozenset(),
            include=tuple(include),
        )

    def including(self, directories: Iterable[Path]) -> Interest:
        """This interest, with every entry of ``directories`` counting too."""
        everything = self.everything | {_key(directory) for directory in directories}
        if everything == self.everything:
            return self
        return Interest(self.exact, self.searched, self.named_parents, self.trees, everything, self.include)

    def __call__(self, _change: int, path: str) -> bool:
        """Whether a change at ``path`` can matter, whatever its kind (watchfiles' filter signature)."""
        path = _key(path)
        if path in self.exact:
            return True
        parent, name = os.path.split(path)
        if parent in self.everything:
            return True
        if name.startswith(".") and (parent in self.searched or parent in self.named_parents):
            return True
        if parent in self.searched and name_matcher(self.include)(name):
            return True
        return path.startswith(self._tree_prefixes)
