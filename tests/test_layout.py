"""The package's layout: the model's own modules (what `save_pretrained` copies beside a model, processor and pipeline
for `trust_remote_code`) import none of the tool modules (training, benchmarks, command line, export), and no module
is over 750 lines."""

import sys
from pathlib import Path

from transformers.dynamic_module_utils import get_imports, get_relative_import_files

import mgsa_hf


PACKAGE = Path(mgsa_hf.__file__).parent
# the modules a saved folder's config, processor config and custom pipeline name (`auto_map`, `custom_pipelines`)
ENTRY_MODULES = ("configuration_mgsa", "modeling_mgsa", "modeling_mgsa_t5", "processing_mgsa", "pipeline_translation")
# what trains, prepares corpora, measures, exports or runs a command line: never part of a saved folder's code
TOOL_MODULES = {"analysis", "cli", "conversion", "corpus_preparation", "data", "distributed", "evaluation", "export",
                "model_card", "prepared_training", "run_ownership", "trainer_mgsa", "training", "treebank"}
TOOL_PREFIXES = ("export_", "onnx", "benchmarking", "training_", "cli_")


def model_closure() -> set[Path]:
    """The entry modules and every module they import relatively, as transformers finds them (the files a saved
    folder carries)."""
    files = set()
    for name in ENTRY_MODULES:
        entry = PACKAGE / f"{name}.py"
        files |= {entry, *map(Path, get_relative_import_files(str(entry)))}
    return {path.resolve() for path in files}


def test_the_model_modules_import_no_tool_module():
    closure = model_closure()
    names = {path.stem for path in closure}
    assert {"modeling_common", "modeling_attention", "variants", "syntax_fields"} <= names  # the closure is real
    assert all(path.parent == PACKAGE.resolve() for path in closure), "remote code is one flat folder"
    tools = sorted(name for name in names if name in TOOL_MODULES or name.startswith(TOOL_PREFIXES))
    assert not tools, f"the model's own modules import tool modules: {tools}"
    # every tool module exists (a renamed one would make this test pass vacuously)
    assert all((PACKAGE / f"{name}.py").is_file() for name in TOOL_MODULES)
    assert (PACKAGE / "benchmarking" / "__init__.py").is_file()


def test_the_model_code_needs_only_torch_and_transformers():
    """The packages transformers requires before it loads a saved folder's code (`check_imports` of each file it
    fetches from the Hub: every import outside `try` blocks) are torch, transformers and their own requirements:
    `datasets` and `pyarrow` (mapping a dataset), spaCy (the parse, for a model that reads syntax) and sentencepiece
    (training a Marian tokenizer) are imported only where used, inside `try` blocks that name the install."""
    packages = set()
    for path in model_closure():
        packages |= set(get_imports(str(path))) - set(sys.stdlib_module_names)
    assert packages == {"torch", "transformers", "huggingface_hub", "tokenizers", "numpy"}


def test_the_benchmarks_are_a_subpackage():
    assert not list(PACKAGE.glob("benchmarking_*.py"))
    assert {path.stem for path in (PACKAGE / "benchmarking").glob("*.py")} >= {"rows", "speed", "quality"}


def test_no_module_is_over_750_lines():
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 40
    assert not {name: length for name, length in lengths.items() if length > 750}
