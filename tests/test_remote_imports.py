"""A saved folder's own code (`trust_remote_code=True`) imports only what its path uses: where `mgsa_hf`, `datasets`
and `pyarrow` are not installed, its processor, model and pipeline load and translate as the package does; spaCy is
needed only by a model that reads the source syntax, and where a package is missing the pipeline names it.

Each check runs in a fresh process whose import system reports the refused packages as not installed (every finder
of `sys.meta_path` wrapped, so that `importlib.util.find_spec` and transformers' own import check see them absent)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from mgsa_hf import MgsaForConditionalGeneration, MgsaProcessor
from mgsa_hf.pipeline_translation import MgsaTranslationPipeline


SOURCES = ["A man rides a bike down the street.", "Two dogs play in the snow."]
WITHOUT_PACKAGE = ["mgsa_hf", "datasets", "pyarrow"]
WITHOUT_SPACY = [*WITHOUT_PACKAGE, "spacy", "thinc"]

PROBE = textwrap.dedent(
    """
    import json, sys

    REFUSED = set(json.loads(sys.argv[2]))


    class Absent:
        # finds what `finder` finds, except the refused packages, which are then not installed
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in REFUSED or not hasattr(self.finder, "find_spec"):
                return None
            return self.finder.find_spec(name, path, target)

        def __getattr__(self, name):
            return getattr(self.finder, name)


    sys.meta_path[:] = [Absent(finder) for finder in sys.meta_path]
    from transformers import AutoModelForSeq2SeqLM, AutoProcessor, pipeline

    folder, sources, result = sys.argv[1], json.loads(sys.argv[3]), {}
    try:
        processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        result["classes"] = [type(processor).__module__, type(model).__module__]
        result["generate"] = model.generate(**processor(sources, return_tensors="pt")).tolist()
    except Exception as error:
        result["processor_error"] = f"{type(error).__name__}: {error}"
    try:
        translator = pipeline(model=folder, trust_remote_code=True)
        result["pipeline"] = [row["translation_text"] for row in translator(sources)]
    except Exception as error:
        result["pipeline_error"] = f"{type(error).__name__}: {error}"
    result["imported"] = sorted(name for name in REFUSED if name in sys.modules)
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, multi30k_processor, tiny_config):
    """Saved folders (model, processor, code) of a tiny hybrid model, which reads no syntax, and a tiny RHE model,
    which reads the parse: `{encoder_type: (folder, generated ids, pipeline translations)}`, those of the package."""
    made = {}
    for encoder_type in ("hybrid", "rhe"):
        folder = tmp_path_factory.mktemp("remote") / encoder_type
        config = tiny_config(multi30k_processor, encoder_type)
        torch.manual_seed(0)
        model = MgsaForConditionalGeneration(config).eval()
        model.generation_config.max_new_tokens = 8
        processor = MgsaProcessor(multi30k_processor.tokenizer, with_syntax=config.reads_source_syntax)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        with torch.no_grad():
            generated = model.generate(**processor(SOURCES, return_tensors="pt")).tolist()
        translator = MgsaTranslationPipeline(model=model, processor=processor)
        made[encoder_type] = folder, generated, [row["translation_text"] for row in translator(SOURCES)]
    return made


def probe(folder, refused: list[str], cwd) -> dict:
    """What the probe process reports: the outputs of the folder's processor + model and pipeline, or their errors,
    and which refused packages got imported (none may). Its copies of remote code go to a cache of its own."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), json.dumps(refused), json.dumps(SOURCES)],
        capture_output=True, text=True, check=False, cwd=cwd, timeout=300,
        env={**os.environ, "HF_MODULES_CACHE": str(cwd / "modules")},
    )
    assert result.returncode == 0 and result.stdout.strip(), result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("encoder_type, refused", [("hybrid", WITHOUT_SPACY), ("rhe", WITHOUT_PACKAGE)])
def test_a_saved_folder_translates_without_the_packages_its_path_does_not_use(folders, encoder_type, refused,
                                                                              tmp_path):
    folder, generated, translations = folders[encoder_type]
    result = probe(folder, refused, tmp_path)
    assert "processor_error" not in result and "pipeline_error" not in result, result
    assert result["imported"] == []
    assert all(module.startswith("transformers_modules") for module in result["classes"]), result["classes"]
    assert result["generate"] == generated and result["pipeline"] == translations


def test_a_model_that_reads_the_parse_names_spacy_when_it_is_missing(folders, tmp_path):
    """The RHE folder's processor and model load without spaCy; parsing a sentence, directly or in the pipeline,
    raises an `ImportError` naming spaCy and its install, not a missing processor."""
    result = probe(folders["rhe"][0], WITHOUT_SPACY, tmp_path)
    for key in ("processor_error", "pipeline_error"):
        assert result[key].startswith("ImportError") and "need spaCy (No module named 'spacy')" in result[key]
        assert "pip install 'spacy" in result[key] and "processor" not in result[key].split(":")[1]
    assert result["imported"] == []


def test_the_pipeline_names_the_package_that_the_processor_code_lacks(folders, tmp_path):
    """Where the folder's processor code imports a package that is not installed (here one added to it),
    transformers refuses to load it and the pipeline drops it: the pipeline then names the package."""
    folder = tmp_path / "rhe"
    shutil.copytree(folders["rhe"][0], folder)
    code = folder / "processing_mgsa.py"
    code.write_text(code.read_text() + "\n\ndef extra_rules():\n    import absent_rules_package\n")
    result = probe(folder, WITHOUT_PACKAGE, tmp_path)
    assert "absent_rules_package" in result["processor_error"]
    assert result["pipeline_error"].startswith("ImportError: The processor of")
    assert "requires the following packages that were not found in your environment: absent_rules_package" in \
        result["pipeline_error"]
