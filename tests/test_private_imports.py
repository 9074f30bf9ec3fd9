"""No private name is imported across packages of ``src/dynascope``.

A package is a top-level sub-folder of ``src/dynascope`` (``probes``, ``train``, ...); a
top-level module (``store.py``, ``config.py``) is a package of its own, and so is the root
``__init__.py``. A name is private when any part of the imported path or the imported name
starts with ``_`` (``dynascope.train._ddp``, ``from dynascope.probes import _kernels``,
``from dynascope.store import _lock``); dunder names are not private. Within a package,
private helpers are the norm (STYLE.md: helpers in ``_x.py``, public names re-exported).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def cross_package_private_imports(src: Path, top: str = "dynascope") -> list[str]:
    """``path:line: <package> imports <module[.name]>`` for each private import across packages.

    Reads every ``.py`` file below ``src/top`` with :mod:`ast` (nothing is imported), resolving
    relative imports against the file's own package.
    """
    found = []
    for path in sorted((src / top).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[:-1]  # what a relative import of level 1 resolves against
        if parts[-1] == "__init__":
            parts = parts[:-1]
        own = parts[1] if len(parts) > 1 else top
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                imported = [(module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [(alias.name, "") for alias in node.names]
            else:
                continue
            for module, name in imported:
                target = module.split(".")
                if target[0] != top:
                    continue
                target_package = target[1] if len(target) > 1 else top
                if target_package == own:
                    continue
                if any(_private(p) for p in target[1:]) or _private(name):
                    shown = f"{module}.{name}" if name else module
                    found.append(f"{path}:{node.lineno}: {own} imports {shown}")
    return found


def test_no_private_name_is_imported_across_packages():
    assert cross_package_private_imports(SRC) == []


def test_the_scan_finds_each_form_of_a_private_import_and_passes_the_rest(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/store.py": "from pkg._lock import Lock\n",  # top-level module -> private module
        "pkg/_lock.py": "",
        "pkg/a/__init__.py": "from ._x import y\nfrom . import _z\n",  # own package: allowed
        "pkg/a/_x.py": "",
        "pkg/a/m.py": (
            "from ..b import _helper\n"  # private name of another package
            "import pkg.b._impl\n"  # private module of another package
            "from pkg.b import public, __version__\n"  # public and dunder: allowed
            "from .. import store\n"  # a top-level module, public: allowed
            "import numpy._core\n"  # not ours: ignored
        ),
        "pkg/b/__init__.py": "from pkg.store import _private_name\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [line.split(": ", 1)[1] for line in cross_package_private_imports(tmp_path, "pkg")]
    assert found == [
        "a imports pkg.b._helper",
        "a imports pkg.b._impl",
        "b imports pkg.store._private_name",
        "store imports pkg._lock.Lock",
    ]
