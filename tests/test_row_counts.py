"""Every row file of `configs/<method>/` loads, builds and adds the parameters its README's table says (issue #46),
and the readings added to reach the papers' counts are the defaults' families of functions re-parametrised."""

import json
import re

import pytest
import torch
from conftest import tiny_sizes

from mgsa_hf import MgsaConfig
from mgsa_hf.benchmarking.rows import CONFIGS, parameters_added
from mgsa_hf.modeling_syntax_inputs import MgsaSyntaxInputs
from mgsa_hf.variant_phrase_memory import PhraseMemoryAttention, PhraseMemoryInputs
from mgsa_hf.variant_phrase_representation import AttentivePhraseCombination


pytestmark = pytest.mark.usefixtures("one_thread")

FOLDERS = ("phrase_memory", "phrase_representation", "hybrid", "rhe")
# a table line with a file: | row | paper | +package | `file.json` | verdict |
TABLE_ROW = re.compile(r"^\| [^|]+ \| [^|]+ \| \+([\d,]+) \| `([\w.-]+)\.json` \|", re.M)


def readme_counts(folder: str) -> dict[str, int]:
    """File stem → the package's count printed in the folder's README table."""
    text = (CONFIGS / folder / "README.md").read_text()
    table = text.split("<!-- parameter-table -->")[1].split("<!-- /parameter-table -->")[0]
    return {stem: int(count.replace(",", "")) for count, stem in TABLE_ROW.findall(table)}


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_row_file_builds_at_its_readme_count(folder):
    """Each file is in the table and builds (meta device, Transformer-base or the file's Big sizes) adding exactly
    the parameters printed there; the table names no missing file."""
    counts = readme_counts(folder)
    files = {path.stem for path in (CONFIGS / folder).glob("*.json")}
    assert set(counts) == files
    for stem, count in counts.items():
        assert parameters_added(json.loads((CONFIGS / folder / f"{stem}.json").read_text())) == count, stem


def test_paper_count_readings():
    """The readings' counts at Transformer-base: MG-SA's W_q/W_k alone removes the 2 · 6 · 64² per layer of the
    head-space K/V; PR's unfolded W_O adds 12 (d² + d), Table 2's +40.9M."""
    row = json.loads((CONFIGS / "phrase_memory" / "ngram_sans_layer_0.json").read_text())
    assert parameters_added(row) - parameters_added({**row, "phrase_memory_key_value": "none"}) == 2 * 6 * 64 * 64
    row = json.loads((CONFIGS / "phrase_representation" / "max.json").read_text())
    unfolded = parameters_added({**row, "pr_unfolded_output_projection": True})
    assert unfolded - parameters_added(row) == 12 * (512 * 512 + 512) and round(unfolded / 1e6, 1) == 40.9


def test_unfolded_output_projection_is_the_folded_function():
    """With W_O = I and b_O = 0, W3_p = the folded projection and b3 its bias, the unfolded combination computes
    exactly the folded one (Eqs. 7-8 as printed and as learnt by default are one family of functions)."""
    fields = dict(tiny_sizes(vocab_size=40, pad_token_id=1), encoder_type="phrase_representation")
    torch.manual_seed(0)
    folded = AttentivePhraseCombination(MgsaConfig(**fields), 4).eval()
    unfolded = AttentivePhraseCombination(MgsaConfig(**fields, pr_unfolded_output_projection=True), 4).eval()
    state = {name: value for name, value in folded.state_dict().items() if "out_proj" not in name}
    unfolded.load_state_dict(state, strict=False)
    with torch.no_grad():
        unfolded.attn.out_proj.weight.copy_(torch.eye(32))
        unfolded.attn.out_proj.bias.zero_()
        unfolded.combine_phrase.weight.copy_(folded.attn.out_proj.weight)
        unfolded.combine_token.bias.copy_(folded.attn.out_proj.bias)
        hidden, phrases = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
        torch.testing.assert_close(unfolded(hidden, phrases, None), folded(hidden, phrases, None))


def test_memory_read_without_key_value_is_identity_head_space(multi30k_processor, multi30k_val):
    """MG-SA's `phrase_memory_key_value="none"` is the head-space reading with W_K^h = W_V^h = I (Eq. 5)."""
    batch = multi30k_processor(multi30k_val[0][:3], return_tensors="pt")
    fields = dict(tiny_sizes(vocab_size=len(multi30k_processor.tokenizer), pad_token_id=1),
                  encoder_type="phrase_memory", num_phrase_tags=len(multi30k_processor.phrase_tags))
    torch.manual_seed(0)
    projected = PhraseMemoryAttention(MgsaConfig(**fields), 4, layer_idx=0).eval()
    direct = PhraseMemoryAttention(MgsaConfig(**fields, phrase_memory_key_value="none"), 4, layer_idx=0).eval()
    assert direct.phrase_key_value is None
    direct.load_state_dict({k: v for k, v in projected.state_dict().items() if "phrase_key_value" not in k})
    with torch.no_grad():
        projected.phrase_key_value.key_weight.copy_(torch.eye(8).expand(3, 8, 8))
        projected.phrase_key_value.value_weight.copy_(torch.eye(8).expand(3, 8, 8))
        syntax = MgsaSyntaxInputs(padding_mask=batch["attention_mask"].bool(), phrase_ids=batch["phrase_ids"],
                                  phrase_tags=batch["phrase_tags"])
        inputs = PhraseMemoryInputs.from_syntax(projected.config, syntax)
        hidden = torch.randn(*batch["input_ids"].shape, 32)
        torch.testing.assert_close(direct(hidden, syntax=inputs)[0], projected(hidden, syntax=inputs)[0])


READINGS = [("phrase_memory", {"phrase_memory_key_value": "none", "on_lstm_chunk_size": 2}),
            ("phrase_representation", {"pr_unfolded_output_projection": True})]


@pytest.mark.parametrize("backbone", ["marian", "t5"])
@pytest.mark.parametrize(("encoder_type", "fields"), READINGS, ids=[name for name, _ in READINGS])
def test_readings_train_save_and_load(multi30k_processor, multi30k_val, tiny_config, tiny_t5_config, tmp_path,
                                      backbone, encoder_type, fields):
    """The new readings on both backbones: every parameter gets a gradient, and a saved model reloads its reading
    and its logits."""
    from mgsa_hf import MgsaForConditionalGeneration, MgsaT5ForConditionalGeneration

    batch = dict(multi30k_processor(multi30k_val[0][:2], text_target=multi30k_val[1][:2], return_tensors="pt"))
    make, model_class = ((tiny_config, MgsaForConditionalGeneration) if backbone == "marian" else
                         (tiny_t5_config, MgsaT5ForConditionalGeneration))
    torch.manual_seed(0)
    model = model_class(make(multi30k_processor, encoder_type, **fields))
    model(**batch).loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters() if parameter.requires_grad)
    model.eval().save_pretrained(tmp_path)
    loaded = model_class.from_pretrained(tmp_path).eval()
    assert all(getattr(loaded.config, key) == value for key, value in fields.items())
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits)
