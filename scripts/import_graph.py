"""The package's import graph, read from the code (`ast`, nothing is imported): every module of `src/mgsa_hf` with the
modules it imports (at the top, and inside functions), the import cycles, and the edges from the model package (the
top-level modules) into the tool subpackages.

    python scripts/import_graph.py            # cycles and model -> tool edges (none expected), then the graph
    python scripts/import_graph.py --dot      # Graphviz, one cluster per subpackage

`tests/test_layout.py` reads `import_graph` and `cycles` from here. Written by hand: `ast` gives every import, and the
two readers we tried (`pydeps`, `import-linter`) either import the code or leave out the imports inside functions.
"""

import argparse
import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf"


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package (`mgsa_hf.training.run`, `mgsa_hf.cli`, ...)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module → the package's modules it imports anywhere in its code (type-checking-only imports included).
    `from . import x` counts as importing the module `x` where `x` is one, else as importing the package."""
    modules = module_names(package)
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                parent = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    imported = f"{target}.{alias.name}"
                    graph[name].add(imported if imported in modules else target)
            elif isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names)
        graph[name] = {target for target in graph[name] if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def is_model_module(name: str, graph: dict[str, set[str]]) -> bool:
    """A top-level module of the package (the model package; its `__init__` is `mgsa_hf`), not a module of a tool
    subpackage (`mgsa_hf.training`, `mgsa_hf.training.run`, ...)."""
    return name == "mgsa_hf" or (name.count(".") == 1 and not any(other.startswith(f"{name}.") for other in graph))


def model_to_tool_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(model module, tool module) for every import from the model package into a tool subpackage, but the package's
    front door: `mgsa_hf` offers `MgsaSeq2SeqTrainer` (`mgsa_hf.training.trainer`) when asked for it. Remote code
    never runs `mgsa_hf/__init__.py`."""
    model = [name for name in graph if is_model_module(name, graph) and name != "mgsa_hf"]
    return sorted((name, target) for name in model for target in graph[name] if not is_model_module(target, graph))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dot", action="store_true", help="print the graph in Graphviz's language")
    args = parser.parse_args()
    graph = import_graph()
    if args.dot:
        print("digraph mgsa_hf {\n  rankdir=LR; node [shape=box, fontsize=10];")
        subpackages = sorted({name.split(".")[1] for name in graph if not is_model_module(name, graph)})
        for subpackage in subpackages:
            print(f'  subgraph "cluster_{subpackage}" {{ label="{subpackage}";')
            for name in sorted(graph):
                if not is_model_module(name, graph) and name.split(".")[1] == subpackage:
                    print(f'    "{name}";')
            print("  }")
        for name in sorted(graph):
            for target in sorted(graph[name]):
                print(f'  "{name}" -> "{target}";')
        print("}")
        return
    print("cycles:", cycles(graph) or "none")
    upward = model_to_tool_edges(graph)
    print("model package -> tool subpackages:", upward or "none")
    for name in sorted(graph):
        print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")


if __name__ == "__main__":
    main()
