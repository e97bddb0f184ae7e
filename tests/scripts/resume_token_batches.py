"""Under `accelerate launch`: a tiny MGSA model trained by `MgsaSeq2SeqTrainer` in token-count batches on 120 pairs of
random token ids, 2 to 16 tokens long, into its fourth epoch (epoch 3) with a checkpoint in the middle of epoch 2;
then a fresh trainer resumes from that checkpoint and trains to the same step. Writes, for each process,
`<output_dir>/rank<process index>.json`: the epoch of the checkpoint, whether the resumed run's batches are the
uninterrupted run's from the checkpoint on, and the largest difference between the two runs' final weights."""

import gc
import json
import os
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments

from mgsa_hf import MgsaConfig, MgsaDataCollator, MgsaForConditionalGeneration, MgsaSeq2SeqTrainer
from mgsa_hf.training.trainer import TokenBatchSampler


MAX_TOKENS = 64


class RecordingCollator(MgsaDataCollator):
    """`MgsaDataCollator` that keeps the `input_ids` of every batch it pads, in order."""

    def __call__(self, features, *args, **kwargs):
        self.batches.append([list(feature["input_ids"]) for feature in features])
        return super().__call__(features, *args, **kwargs)


def train(output_dir: Path, dataset: Dataset, steps: int, checkpoint_step: int, resume: str | None = None):
    torch.manual_seed(0)
    config = MgsaConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                        pad_token_id=2, decoder_start_token_id=2, eos_token_id=0, dropout=0.1)
    args = Seq2SeqTrainingArguments(output_dir=str(output_dir), max_steps=steps, save_strategy="steps",
                                    save_steps=checkpoint_step, learning_rate=1e-3, report_to="none",
                                    disable_tqdm=True, use_cpu=True, seed=0)
    collator = RecordingCollator(pad_token_id=2)
    collator.batches = []
    trainer = MgsaSeq2SeqTrainer(model=MgsaForConditionalGeneration(config), args=args, train_dataset=dataset,
                                 data_collator=collator, max_tokens_per_batch=MAX_TOKENS)
    trainer.train(resume_from_checkpoint=resume)
    weights = {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}
    # frees the distributed wrapper while the process group is open (see `MgsaSeq2SeqTrainer.end_training`)
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    gc.collect()
    return trainer, weights, collator.batches


def main() -> None:
    output_dir = Path(sys.argv[1])
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 17, (120,), generator=generator).tolist()
    rows = [torch.randint(3, 40, (length,), generator=generator).tolist() for length in lengths]
    dataset = Dataset.from_list([{"input_ids": row + [0], "labels": row[::-1] + [0]} for row in rows])
    # the steps of an epoch in each process: the batches of an epoch, dealt whole to the processes
    sampler = TokenBatchSampler([len(row) + 1 for row in rows], [len(row) + 1 for row in rows], MAX_TOKENS)
    per_epoch = len(sampler) // int(os.environ.get("WORLD_SIZE", "1"))
    checkpoint_step, steps = 2 * per_epoch + per_epoch // 2, 3 * per_epoch + per_epoch // 2

    trainer, uninterrupted, seen = train(output_dir / "uninterrupted", dataset, steps, checkpoint_step)
    checkpoint = output_dir / "uninterrupted" / f"checkpoint-{checkpoint_step}"
    epoch = json.loads((checkpoint / "trainer_state.json").read_text())["epoch"]
    resumed_trainer, resumed, resumed_seen = train(output_dir / "resumed", dataset, steps, checkpoint_step,
                                                   resume=str(checkpoint))
    difference = max(float((resumed[name] - tensor).abs().max()) for name, tensor in uninterrupted.items())
    record = {"world_size": trainer.args.world_size, "global_step": resumed_trainer.state.global_step,
              "steps_per_epoch": per_epoch, "checkpoint_epoch": epoch, "batches": len(resumed_seen),
              "same_batches": resumed_seen == seen[checkpoint_step:], "max_abs_difference": difference,
              "equal": all(torch.equal(resumed[name], tensor) for name, tensor in uninterrupted.items())}
    Path(output_dir, f"rank{trainer.args.process_index}.json").write_text(json.dumps(record))
    resumed_trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
