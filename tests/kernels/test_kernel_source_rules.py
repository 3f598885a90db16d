"""Source rules for the Triton kernels that the CPU interpreter cannot enforce.

The interpreter runs a kernel body as Python; the compiler does not. A `for` loop whose variable is assigned again in
its body (`k0 = tl.multiple_of(k0, 64)`) ran correctly under TRITON_INTERPRET=1 and produced garbage when compiled for
an H100: CI, which has no GPU, would pass such a kernel. This test reads the kernels' source instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sdaccel.kernels

KERNEL_DIR = Path(sdaccel.kernels.__file__).parent


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "jit"
            and isinstance(target.value, ast.Name) and target.value.id == "triton")


def _names(target: ast.expr) -> set[str]:
    """The names an assignment (or a loop) binds: `a`, `a, b`, `*a`; not those inside `x[a] = ...` or `o.a = ...`."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_names(element) for element in target.elts))
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return set()


def loop_variables_reassigned(source: str) -> list[str]:
    """'function:line name' for every loop variable assigned inside its own loop's body, in @triton.jit functions."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not any(_is_triton_jit(d) for d in fn.decorator_list):
            continue
        for loop in (node for node in ast.walk(fn) if isinstance(node, ast.For)):
            loop_vars = _names(loop.target)
            for node in (n for stmt in loop.body for n in ast.walk(stmt)):
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                else:
                    continue
                for name in sorted(loop_vars & set().union(*(_names(t) for t in targets))):
                    found.append(f"{fn.name}:{node.lineno} {name}")
    return found


def test_no_kernel_assigns_to_its_loop_variable():
    offenders = {path.name: loop_variables_reassigned(path.read_text()) for path in sorted(KERNEL_DIR.glob("*.py"))}
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, f"loop variables assigned in their loop's body (rename the new value): {offenders}"


def test_the_rule_finds_what_it_is_for():
    bad = (
        "import triton\n"
        "@triton.jit(do_not_specialize=['n'])\n"
        "def k(n, B: tl.constexpr):\n"
        "    for k0 in tl.range(0, n, B):\n"
        "        k0 = tl.multiple_of(k0, B)\n"
        "    for i in range(n):\n"
        "        i += 1\n"
        "    for j, m in pairs:\n"
        "        x[j] = m\n"  # writes through j, does not rebind it
        "        m, y = y, m\n"
        "@triton.jit\n"
        "def fine(n):\n"
        "    for k_block in range(n):\n"
        "        k0 = tl.multiple_of(k_block, 16)\n"
        "def plain_python(n):\n"
        "    for i in range(n):\n"
        "        i = 0\n"
    )
    assert loop_variables_reassigned(bad) == ["k:5 k0", "k:7 i", "k:10 m"]
