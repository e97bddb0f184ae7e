"""The parse apart from the tokenizer: fields derived from cached parses equal those of a live parse, and a
preparation with another vocabulary reads the corpus's parses back without running spaCy."""

from pathlib import Path

import pytest
from conftest import MULTI30K_DIR
from datasets import Dataset

from mgsa_hf.processing_mgsa import MgsaProcessor
from mgsa_hf.syntax_parser import SyntaxParser
from mgsa_hf.tokenization_utils import read_lines
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.corpus import parsed_features, prepare


pytestmark = pytest.mark.usefixtures("one_thread")

TINY = Path(__file__).resolve().parents[1] / "src" / "mgsa_hf" / "training" / "recipes" / "tiny.yaml"

# the processor of RHE (the default settings), and MG-SA's with other field settings and the hand-written rules
PROCESSORS = {
    "rhe": {},
    "mgsa_syntactic": {"phrase_levels": 2, "pr_segmentation_budget": "tokens_as_printed", "tree_parser": "rules"},
}


@pytest.fixture(scope="module")
def sample():
    """300 Multi30k train pairs."""
    sources = list(read_lines(MULTI30K_DIR / "train.en.gz", 300))
    return sources, list(read_lines(MULTI30K_DIR / "train.de.gz", 300))


def no_parse(*args, **kwargs):
    raise AssertionError("spaCy was called")


@pytest.mark.parametrize("settings", PROCESSORS.values(), ids=PROCESSORS.keys())
@pytest.mark.parametrize("tokenizer", ["fast", "marian"])
def test_fields_from_cached_parses_equal_a_live_parse(settings, tokenizer, sample, multi30k_processor,
                                                      marian_processor, monkeypatch):
    """Every field of `processor(..., parses=...)` (parses stored in Arrow and read back) equals the direct call's,
    cut or not, and with a given tree; the call with parses runs no parser."""
    base = multi30k_processor if tokenizer == "fast" else marian_processor
    processor = MgsaProcessor(base.tokenizer, **settings)
    sources, targets = list(sample[0]), sample[1]
    trees = [None] * len(sources)
    trees[1] = "(S (NP (CD Two) (JJ young) (NNS guys)) (VP (VBP are) (ADVP (RB outside))))"
    sources[1] = "Two young guys are outside"
    stored = Dataset.from_list(processor.parse(sources, trees), features=parsed_features())
    parses = list(stored)
    for lengths in ({}, {"max_length": 8, "truncation": True}):
        live = processor(sources, text_target=targets, trees=trees, **lengths)
        with monkeypatch.context() as patch:
            patch.setattr(SyntaxParser, "pipe", no_parse)
            cached = processor(sources, text_target=targets, parses=parses, **lengths)
        assert list(cached) == list(live) and all(cached[name] == live[name] for name in live)
    assert processor(sources[:4], return_tensors="pt", parses=parses[:4])["tree_depth"].shape[0] == 4


def test_bad_parses_are_refused_by_name(multi30k_processor):
    texts = ["A dog runs.", "Two cats sleep."]
    parses = multi30k_processor.parse(texts)
    with pytest.raises(ValueError, match=r"parses\[1\] has words up to character"):
        multi30k_processor(texts, parses=[parses[0], multi30k_processor.parse("A dog runs in the park.")[0]])
    with pytest.raises(ValueError, match=r"parses\[0\] lacks \['heads'\]"):
        multi30k_processor(texts[:1], parses=[{k: v for k, v in parses[0].items() if k != "heads"}])
    with pytest.raises(ValueError, match="one per sentence"):
        multi30k_processor(texts, parses=parses[:1])
    assert MgsaProcessor(multi30k_processor.tokenizer, phrase_levels=2).parse_fingerprint() == \
        multi30k_processor.parse_fingerprint() != MgsaProcessor(multi30k_processor.tokenizer,
                                                                tree_parser="rules").parse_fingerprint()


@pytest.mark.parametrize("encoder_type", ["rhe", "phrase_memory"])
def test_another_vocabulary_reuses_the_parse(tmp_path, monkeypatch, encoder_type):
    """A second preparation of the corpus with another `vocab_size` (its own run, one `prepared_dir`) runs no spaCy
    and gives the fields of a fresh preparation."""

    def recipe(name, vocab_size, prepared):
        return load_train_config(TINY, [f"data={MULTI30K_DIR}", f"output_dir={tmp_path / name}",
                                        f"model.encoder_type={encoder_type}", "max_train_samples=40",
                                        f"vocab_size={vocab_size}", f"prepared_dir={tmp_path / prepared}"])

    prepare(recipe("first", 300, "prepared"))
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "prepared").iterdir()) == \
        ["corpus", "parsed", "processed"]
    with monkeypatch.context() as patch:
        patch.setattr(SyntaxParser, "pipe", no_parse)
        _, processor, again = prepare(recipe("second", 400, "prepared"))
    assert len(processor.tokenizer) > 300 and processor.parser._nlp is None  # spaCy not even loaded
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "prepared").iterdir()) == \
        ["corpus", "parsed", "processed", "processed"]
    _, _, fresh = prepare(recipe("second", 400, "fresh"))
    for split in fresh:
        assert again[split][:] == fresh[split][:]
