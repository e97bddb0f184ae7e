"""The package's layout: the model package is the flat top of `src/mgsa_hf` (what `save_pretrained` copies beside a
model, processor and pipeline for `trust_remote_code`, and nothing else); the tools (training, evaluation, export, the
command line, benchmarks) are subpackages that import it and that it never imports; no import cycle; no module is over
750 lines."""

import importlib.util
import re
import sys
from pathlib import Path

from transformers.dynamic_module_utils import get_imports, get_relative_import_files

import mgsa_hf


PACKAGE = Path(mgsa_hf.__file__).parent
# the modules a saved folder's config, processor config and custom pipeline name (`auto_map`, `custom_pipelines`)
ENTRY_MODULES = ("configuration_mgsa", "modeling_mgsa", "modeling_mgsa_t5", "processing_mgsa", "pipeline_translation")
# what trains, prepares corpora, measures, exports or runs a command line: never part of a saved folder's code
TOOL_PACKAGES = {"training", "evaluation", "export", "cli", "benchmarking"}
REPO = PACKAGE.parents[1]


def load_import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_closure() -> set[Path]:
    """The entry modules and every module they import relatively, as transformers finds them (the files a saved
    folder carries)."""
    files = set()
    for name in ENTRY_MODULES:
        entry = PACKAGE / f"{name}.py"
        files |= {entry, *map(Path, get_relative_import_files(str(entry)))}
    return {path.resolve() for path in files}


def test_the_top_of_the_package_is_the_model_package():
    """Remote code is one flat folder: the entry modules' relative imports reach every top-level module (but the
    package's `__init__`), and nothing else; every other module is in a tool subpackage."""
    closure = model_closure()
    assert {"modeling_common", "modeling_attention", "variants", "syntax_fields"} <= {path.stem for path in closure}
    assert all(path.parent == PACKAGE.resolve() for path in closure), "remote code is one flat folder"
    top = {path.resolve() for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    assert top == closure, f"top-level modules no saved folder copies: {sorted(p.name for p in top - closure)}"
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == TOOL_PACKAGES | {"rows"}, folders  # rows/: the papers' configurations, data
    assert all((PACKAGE / name / "__init__.py").is_file() for name in TOOL_PACKAGES)


def test_no_import_cycle_and_the_model_imports_no_tool():
    """Read from every import statement, those inside functions included (a cycle there still ties two modules
    together): no cycle, and no edge from the model package into a tool subpackage."""
    graph_module = load_import_graph()
    graph = graph_module.import_graph()
    assert len(graph) > 50 and graph["mgsa_hf.training.run"] >= {"mgsa_hf.training.config", "mgsa_hf.training.corpus"}
    assert graph_module.cycles(graph) == []
    assert graph_module.model_to_tool_edges(graph) == []


def test_the_cycle_finder_finds_cycles(tmp_path):
    """The check above can fail: a cycle through an import inside a function, and a model module importing a tool."""
    graph_module = load_import_graph()
    package = tmp_path / "mgsa_hf"
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "modeling_x.py").write_text("def f():\n    from .training import run\n")
    (package / "training" / "__init__.py").write_text("")
    (package / "training" / "run.py").write_text("from . import config\n")
    (package / "training" / "config.py").write_text("def g():\n    from .run import h\n")
    graph = graph_module.import_graph(package)
    assert graph_module.cycles(graph) == [["mgsa_hf.training.config", "mgsa_hf.training.run"]]
    assert ("mgsa_hf.modeling_x", "mgsa_hf.training.run") in graph_module.model_to_tool_edges(graph)


def test_the_model_code_needs_only_torch_and_transformers():
    """The packages transformers requires before it loads a saved folder's code (`check_imports` of each file it
    fetches from the Hub: every import outside `try` blocks) are torch, transformers and their own requirements:
    `datasets` and `pyarrow` (mapping a dataset), spaCy (the parse, for a model that reads syntax) and sentencepiece
    (training a Marian tokenizer) are imported only where used, inside `try` blocks that name the install."""
    packages = set()
    for path in model_closure():
        packages |= set(get_imports(str(path))) - set(sys.stdlib_module_names)
    assert packages == {"torch", "transformers", "huggingface_hub", "tokenizers", "numpy"}


def test_no_module_is_over_750_lines():
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 40
    assert not {name: length for name, length in lengths.items() if length > 750}


def test_benchmarks_show_today():
    """benchmarks/ holds one current result per benchmark under a plain name (what it measures, the device): no issue
    number or before/after/recheck in a name (history is HISTORY.md and git), and no machine's path in a result."""
    folder = REPO / "benchmarks"
    names = [path.relative_to(folder).as_posix() for path in folder.rglob("*")]
    assert "BENCHMARKS.md" in names and len(names) > 20
    assert not [name for name in names if re.search(r"before|after|recheck|-\d{2,3}[.-]", name)]
    machine_path = re.compile(r"(?<![\w.])/(work|root|home|tmp|Users|mnt)/")
    texts = {path: path.read_text(encoding="utf-8") for path in folder.rglob("*")
             if path.is_file() and path.suffix in {".md", ".json", ".txt"}}
    assert not sorted(str(path.relative_to(folder)) for path, text in texts.items() if machine_path.search(text))
