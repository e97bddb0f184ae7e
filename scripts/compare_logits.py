"""Logits of every variant x backbone before and after a change of the code: the same seed, config and real processor
batch, computed by two checkouts.

    git worktree add ../before <commit>
    python scripts/compare_logits.py dump --src ../before/src --out before.pt
    python scripts/compare_logits.py dump --src src --out after.pt
    python scripts/compare_logits.py compare before.pt after.pt

`dump` builds each model with torch.manual_seed(0), saves its state dict and its eval logits (and loss, and the
training loss/grad norm of one step) on a batch of 8 Multi30k val pairs made by the processor of that code.
Both dumps read the tokenizer the first one trained (`--workdir`; training it is not deterministic). `compare`
imports no model code: it compares the saved logits, and checks the state dicts have the same keys and values
(the same initialisation), so a difference is the computation's.
"""

import argparse
import sys
from pathlib import Path


ROWS = [
    ("transformer", {}),
    ("phrase_memory", {}),
    ("phrase_memory", {"phrase_partition": "ngram", "phrase_tag_supervision": False, "phrase_interaction": "none"}),
    ("phrase_representation", {}),
    ("phrase_representation", {"pr_segmentation": "parse"}),
    ("hybrid", {}),
    ("hybrid", {"hybrid_combination": "concat"}),
    ("rhe", {}),
    ("rhe", {"rhe_attention": "dea"}),
    ("rhe", {"rhe_mode": "rhe_prune"}),
    ("rhe", {"rhe_gate": "learned"}),
]
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def dump(src: str, out: str, workdir: str) -> None:
    sys.path.insert(0, src)
    import torch

    import mgsa_hf
    from mgsa_hf import (
        MgsaConfig,
        MgsaForConditionalGeneration,
        MgsaProcessor,
        MgsaT5Config,
        MgsaT5ForConditionalGeneration,
    )
    from mgsa_hf.tokenization_utils import read_lines, train_joint_tokenizer

    assert Path(mgsa_hf.__file__).resolve().is_relative_to(Path(src).resolve()), mgsa_hf.__file__
    torch.set_num_threads(1)
    if (Path(workdir) / "tokenizer.json").exists():
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(workdir)
    else:
        tokenizer = train_joint_tokenizer(f"{MULTI30K}/train.en.gz", f"{MULTI30K}/train.de.gz", Path(workdir),
                                          vocab_size=600, max_sentences=1000)
    processor = MgsaProcessor(tokenizer)
    sources = list(read_lines(f"{MULTI30K}/val.en.gz", 8))
    targets = list(read_lines(f"{MULTI30K}/val.de.gz", 8))
    batch = dict(processor(sources, text_target=targets, return_tensors="pt"))
    special = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                   decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                   num_phrase_tags=len(processor.phrase_tags))
    results = {}
    for backbone in ("marian", "t5"):
        for encoder_type, fields in ROWS:
            if backbone == "marian":
                config = MgsaConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    max_position_embeddings=128, dropout=0.0, encoder_type=encoder_type, **special,
                                    **fields)
                model_class = MgsaForConditionalGeneration
            else:
                config = MgsaT5Config(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                      dropout_rate=0.0, encoder_type=encoder_type, **special, **fields)
                model_class = MgsaT5ForConditionalGeneration
            torch.manual_seed(0)
            model = model_class(config).eval()
            name = f"{backbone}:{encoder_type}:{sorted(fields.items())}"
            with torch.no_grad():
                outputs = model(**batch)
            model.train()
            train_loss = model(**batch).loss
            train_loss.backward()
            grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
            generated = model.eval().generate(**{k: v for k, v in batch.items() if k != "labels"}, num_beams=2,
                                              max_new_tokens=8)
            results[name] = {"input_ids": batch["input_ids"],
                             "state": {k: v.clone() for k, v in model.state_dict().items()},
                             "logits": outputs.logits, "loss": outputs.loss, "train_loss": train_loss.detach(),
                             "grad_norm": grad_norm, "generated": generated}
            print(name, float(outputs.loss), flush=True)
    torch.save(results, out)


def compare(old: str, new: str) -> None:
    import torch

    before, after = torch.load(old, weights_only=True), torch.load(new, weights_only=True)
    assert before.keys() == after.keys(), before.keys() ^ after.keys()
    worst = 0.0
    for name in before:
        a, b = before[name], after[name]
        assert a["state"].keys() == b["state"].keys(), (name, a["state"].keys() ^ b["state"].keys())
        assert torch.equal(a["input_ids"], b["input_ids"]), name
        same_init = all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
        diff = float((a["logits"] - b["logits"]).abs().max())
        worst = max(worst, diff)
        print(f"{name}: same init {same_init}, max |Δ logits| {diff:.2e}, loss {float(a['loss']):.6f} / "
              f"{float(b['loss']):.6f}, train loss equal {bool(torch.equal(a['train_loss'], b['train_loss']))}, "
              f"grad norm {float(a['grad_norm']):.6f} / {float(b['grad_norm']):.6f}, "
              f"generated equal {bool(torch.equal(a['generated'], b['generated']))}")
    print(f"worst max |Δ logits| {worst:.2e} over {len(before)} models")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["dump", "compare"])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--src")
    parser.add_argument("--out")
    parser.add_argument("--workdir", default="/tmp/compare-logits-tokenizer")
    args = parser.parse_args()
    if args.step == "dump":
        dump(args.src, args.out, args.workdir)
    else:
        compare(*args.files)
