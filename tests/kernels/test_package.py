"""No kernel module imports the package sdaccel.kernels itself: the shared helpers come from _triton.py (that no
package attribute shadows a submodule is tests/test_layering.py's)."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import sdaccel.kernels

KERNEL_DIR = Path(sdaccel.kernels.__file__).parent
SUBMODULES = sorted(info.name for info in pkgutil.iter_modules(sdaccel.kernels.__path__))


def package_imports(source: str, submodules: list[str]) -> list[str]:
    """'line: statement' for each import in a kernels submodule's source that reaches the package ``__init__``
    rather than a submodule: ``from . import <not a submodule>``, ``from .. import kernels``, ``import
    sdaccel.kernels`` (alone), ``from sdaccel import kernels``, ``from sdaccel.kernels import <not a submodule>``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name == "sdaccel.kernels"]
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        names = [a.name for a in node.names]
        if (node.level == 1 and node.module is None) or (node.level == 0 and node.module == "sdaccel.kernels"):
            found += [f"{node.lineno}: from {'.' if node.level else node.module} import {n}"
                      for n in names if n not in submodules]
        elif (node.level == 2 and node.module is None) or (node.level == 0 and node.module == "sdaccel"):
            found += [f"{node.lineno}: from {'..' if node.level else 'sdaccel'} import kernels"
                      for n in names if n == "kernels"]
    return found


def test_no_kernel_module_imports_the_package():
    offenders = {path.name: package_imports(path.read_text(), SUBMODULES)
                 for path in sorted(KERNEL_DIR.glob("*.py")) if path.name != "__init__.py"}
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, f"kernel modules importing the package (import from ._triton instead): {offenders}"


def test_the_import_rule_finds_what_it_is_for():
    bad = (
        "from . import use_triton, group_norm_kernels\n"
        "from .. import kernels\n"
        "from sdaccel import kernels\n"
        "import sdaccel.kernels\n"
        "from sdaccel.kernels import next_pow2\n"
        "def f():\n"
        "    from . import sm_count\n"
    )
    fine = (
        "from . import group_norm_kernels as kernels\n"
        "from ._triton import next_pow2, use_triton\n"
        "from .fp8 import E4M3\n"
        "from sdaccel.kernels import fp8\n"
        "import sdaccel.kernels.fp8\n"
        "from .. import errors\n"
    )
    assert package_imports(bad, SUBMODULES) == [
        "1: from . import use_triton", "2: from .. import kernels", "3: from sdaccel import kernels",
        "4: import sdaccel.kernels", "5: from sdaccel.kernels import next_pow2", "7: from . import sm_count"]
    assert package_imports(fine, SUBMODULES) == []
