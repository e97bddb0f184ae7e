"""Every public name of the package has a docstring (the API reference in `docs/` is generated from them).

Public: a module-level function or class of any module under `src/mgsa_hf` whose name has no leading underscore, and
every method (or property) of such a class whose name has no leading underscore. A method that overrides a documented
method of a base class outside the package (`get_encoder`, `compute_loss`, `on_step_end`, ...) inherits that
documentation (mkdocstrings shows it too) and is not counted. Every public name must be documented: there is no list
of exceptions.
"""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import mgsa_hf


PACKAGE_DIR = Path(mgsa_hf.__file__).parent


def module_name(path: Path) -> str:
    return ".".join(("mgsa_hf", *path.relative_to(PACKAGE_DIR).with_suffix("").parts))


def public_definitions():
    """Yields `(module, class_name or None, name, node)` for every public module-level definition and method (`node`
    is None for a class whose docstring is assigned after it)."""
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(PACKAGE_DIR).parts):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # a class documented by an assignment to its `__doc__` (as `MgsaVariantConfig`, from its fields' mixins)
        assigned = {
            target.value.id
            for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Attribute) and target.attr == "__doc__" and isinstance(target.value, ast.Name)
        }
        for node in tree.body:
            definition = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if not definition or node.name.startswith("_"):
                continue
            yield module_name(path), None, node.name, node if node.name not in assigned else None
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                        yield module_name(path), node.name, sub.name, sub


def subclasses(cls):
    """`cls` and every class derived from it (a mixin's methods override what its users' other bases define)."""
    found = [cls]
    for sub in cls.__subclasses__():
        found += subclasses(sub)
    return found


def overrides_documented_base(module: str, class_name: str, name: str) -> bool:
    """Whether `class_name.name` overrides a method that a base class from outside the package documents.

    `forward` always counts: `nn.Module.forward`'s docstring says nothing of a layer's inputs and their shapes.
    """
    if name == "forward":
        return False
    try:
        cls = getattr(importlib.import_module(module), class_name)
    except (ImportError, AttributeError):  # an optional dependency missing: count the method
        return False
    for user in subclasses(cls):
        for base in inspect.getmro(user):
            if base.__module__.split(".")[0] == "mgsa_hf" or name not in vars(base):
                continue
            attribute = vars(base)[name]
            attribute = getattr(attribute, "__func__", getattr(attribute, "fget", attribute))
            if inspect.getdoc(attribute):
                return True
    return False


def undocumented():
    """`(module, qualified name)` of every public name without a docstring."""
    missing = []
    for module, class_name, name, node in public_definitions():
        if node is None or ast.get_docstring(node):
            continue
        if class_name is not None and overrides_documented_base(module, class_name, name):
            continue
        missing.append((module, name if class_name is None else f"{class_name}.{name}"))
    return missing


@pytest.fixture(scope="module")
def missing():
    return undocumented()


def test_every_public_name_has_a_docstring(missing):
    names = [f"{module}: {name}" for module, name in missing]
    assert not names, f"{len(names)} public names without a docstring:\n" + "\n".join(names)


def test_walk_sees_the_public_api():
    # the walk covers the names of `mgsa_hf.__all__` (a walk that found nothing would pass the tests above)
    names = {(module, name) for module, class_name, name, _ in public_definitions() if class_name is None}
    for public in mgsa_hf.__all__:
        assert (getattr(mgsa_hf, public).__module__, public) in names
