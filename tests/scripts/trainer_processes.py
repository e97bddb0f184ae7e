"""A user's training script under `accelerate launch`: a tiny MGSA model trained with `MgsaSeq2SeqTrainer` on 16
pairs of random token ids, all 7 tokens long, in batches of at most 28 tokens (4 pairs) for 2 steps per process,
`use_cpu=True` in its arguments or not (`--use-cpu`); writes each process's `args.world_size` and training metrics to
`<output_dir>/rank<process index>.json`."""

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments

from mgsa_hf import MgsaConfig, MgsaDataCollator, MgsaForConditionalGeneration, MgsaSeq2SeqTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--use-cpu", action="store_true")
    options = parser.parse_args()
    torch.manual_seed(0)
    config = MgsaConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                        pad_token_id=2, decoder_start_token_id=2, eos_token_id=0)
    ids = torch.randint(3, 40, (16, 6)).tolist()
    dataset = Dataset.from_list([{"input_ids": row + [0], "labels": row[::-1] + [0]} for row in ids])
    args = Seq2SeqTrainingArguments(output_dir=options.output_dir, per_device_train_batch_size=1, max_steps=2,
                                    report_to="none", save_strategy="no", disable_tqdm=True,
                                    use_cpu=options.use_cpu)
    trainer = MgsaSeq2SeqTrainer(model=MgsaForConditionalGeneration(config), args=args, train_dataset=dataset,
                                 data_collator=MgsaDataCollator(pad_token_id=2), max_tokens_per_batch=28)
    metrics = trainer.train().metrics
    record = {"world_size": args.world_size, "global_step": trainer.state.global_step, "metrics": metrics}
    Path(options.output_dir, f"rank{args.process_index}.json").write_text(json.dumps(record))
    if options.use_cpu:
        # releases the model's distributed wrapper and closes the process group before the interpreter's teardown
        # (without `use_cpu`, which the package refuses from accelerate 1.4 on, accelerate 1.3's processes hang in it)
        trainer.end_training()


if __name__ == "__main__":
    main()
