"""`import mgsa_hf` and the command line's parser import neither transformers nor torch (`mgsa-hf --help` answers at
once), and the model types still reach transformers' Auto classes and the pipeline however the package is imported."""

import subprocess
import sys

import pytest


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_command_line_answers_without_transformers_or_torch():
    code = """
import contextlib, io, sys
from mgsa_hf.cli import main
for argv in (["--help"], ["train", "--help"], ["convert", "--help"], ["export", "onnx", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main(argv)
    assert "usage: mgsa-hf" in out.getvalue(), argv
main(["accelerate-config"])
print(sorted(name for name in ("torch", "transformers", "spacy", "datasets", "accelerate") if name in sys.modules))
"""
    lines = run(code).splitlines()
    assert "multi_gpu_ddp" in "\n".join(lines)
    assert lines[-1] == "[]"


# what every case prints: the Auto classes' and the pipeline's entries for both model types
CHECK = """
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY
print(type(AutoConfig.for_model("mgsa_t5")).__name__,
      AutoModelForSeq2SeqLM._model_mapping[type(AutoConfig.for_model("mgsa"))].__name__,
      PIPELINE_REGISTRY.check_task("translation")[1]["impl"].__name__)
"""
CASES = {
    # transformers after the package; the public names are there when first used
    "package first": "import sys, mgsa_hf\nassert 'transformers' not in sys.modules\n"
                     "assert mgsa_hf.MgsaProcessor.__name__ == 'MgsaProcessor'\n"
                     "assert set(mgsa_hf.__all__) <= set(dir(mgsa_hf))",
    # transformers imported before the package: registered at `import mgsa_hf`
    "transformers first": "import transformers, mgsa_hf",
    # a model module imported first brings transformers in: registered once that import has finished
    "module first": "from mgsa_hf.modeling_mgsa_t5 import MgsaT5Model",
}


@pytest.mark.parametrize("case", CASES)
def test_the_model_types_are_registered(case):
    assert run(CASES[case] + CHECK) == "MgsaT5Config MgsaForConditionalGeneration MgsaTranslationPipeline"
