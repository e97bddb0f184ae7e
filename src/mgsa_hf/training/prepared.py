"""Training from a prepared corpus with torch, transformers and sacreBLEU alone, for machines without spaCy or
`datasets` (a typical GPU image), and the quality benchmark that compares encoder types at equal steps.

Two steps:

1. [`prepare_corpus`] (needs the package's dependencies: spaCy, `datasets`, `tokenizers`) trains or loads the joint
   tokenizer, runs [`MgsaProcessor`] over every split and writes one folder: `manifest.json`, the tokenizer,
   `{split}.pt` (every field of every sentence as flat `int16`/`int32` tensors with offsets: token ids and all syntax
   fields), and the raw sources and references. Multi30k at the default settings takes about 20 MB.
2. [`train_run`] (needs torch, transformers and sacreBLEU) reads that folder and trains one model on it, with
   token-count batches, AdamW and the inverse-square-root schedule, label smoothing, the model's auxiliary losses
   (MG-SA's tag loss), bf16 autocast on a GPU, checkpoints from which an interrupted run resumes, the average of the
   last checkpoints, and beam-search translation of validation and test scored with sacreBLEU.

Why a loop of its own rather than `Seq2SeqTrainer` (which `mgsa-hf train` uses, with the same token-count batches
through [`TokenBatchSampler`]): the Trainer needs `datasets`-style data and `accelerate`, which a GPU image may lack,
and its label smoother drops the model's auxiliary losses (`MgsaSeq2SeqTrainer` adds them back); this loop is short
and reproducible at equal steps for every variant.
"""

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..evaluation import translation_scores
from ..modeling_loss import caller_adds_tag_loss, translation_loss, with_tag_loss
from ..syntax_fields import LEVELLED_SYNTAX_FIELDS, SOURCE_SYNTAX_PAD_VALUES


PREPARED_FORMAT = 1
SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


# --------------------------------------------------------------------------------------------- the prepared corpus


def prepare_corpus(
    data: str | Path,
    output_dir: str | Path,
    *,
    source_lang: str = "en",
    target_lang: str = "de",
    splits: dict[str, str] | None = None,
    tokenizer: str | Path | None = None,
    vocab_size: int = 8000,
    max_length: int = 128,
    max_samples: int | None = None,
    processor_kwargs: dict | None = None,
    chunk_size: int = 1000,
    trees: dict[str, str | Path] | None = None,
    tree_column: str | None = None,
) -> Path:
    """
    Tokenize and parse a parallel corpus once and write it as a prepared folder (see the module docstring).

    Args:
        data: a folder of `{split}.{lang}[.gz]` files (e.g. Multi30k) or anything
            [`~mgsa_hf.training.data.load_parallel_corpus`] reads.
        output_dir: the folder to write.
        splits: our split name (`train`, `validation`, `test`) → the corpus' split name.
        tokenizer: a tokenizer folder; by default a joint unigram vocabulary of `vocab_size` is trained on train.
        max_length: source and target tokens are truncated to this (syntax fields with them).
        max_samples: keep only the first sentences of each split (tests).
        processor_kwargs: [`MgsaProcessor`] settings (`phrase_levels`, `parser_name`, `tree_parser`, ...).
        trees: our split name → a file of PTB trees of its source sentences, one line per sentence of the whole split
            (an empty line: the processor's own tree); see [`~mgsa_hf.training.data.read_tree_file`].
        tree_column: for JSONL or Hub data, the field holding each source sentence's PTB tree.

    Returns:
        `output_dir`.
    """
    import tempfile

    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from ..processing_mgsa import MgsaProcessor, derived_tree_source
    from ..syntax_trees import TreeError
    from ..tokenization_utils import train_joint_tokenizer
    from .data import TREE_COLUMN, load_parallel_corpus

    output_dir = Path(output_dir)
    corpus = load_parallel_corpus(data, source_lang, target_lang, splits or SPLITS, tree_files=trees or None,
                                  tree_column=tree_column)
    output_dir.mkdir(parents=True, exist_ok=True)
    pairs = {name: split["translation"][:max_samples] for name, split in corpus.items()}
    source_trees = {name: split[TREE_COLUMN][:max_samples] if TREE_COLUMN in split.column_names else None
                    for name, split in corpus.items()}
    if tokenizer is None:
        with tempfile.TemporaryDirectory() as text_dir:
            files = []
            for lang in (source_lang, target_lang):
                files.append(Path(text_dir) / f"train.{lang}")
                files[-1].write_text("\n".join(pair[lang] for pair in pairs["train"]) + "\n", encoding="utf-8")
            train_joint_tokenizer(*files, output_dir / "tokenizer", vocab_size=vocab_size)
    else:
        AutoTokenizer.from_pretrained(tokenizer).save_pretrained(output_dir / "tokenizer")
    processor = MgsaProcessor(AutoTokenizer.from_pretrained(output_dir / "tokenizer"), **(processor_kwargs or {}))
    processor.save_pretrained(output_dir / "processor")

    sizes = {}
    for name, split_pairs in pairs.items():
        sources = [pair[source_lang] for pair in split_pairs]
        targets = [pair[target_lang] for pair in split_pairs]
        fields: dict[str, list] = {}
        progress = tqdm(total=len(sources), desc=f"Parsing and tokenizing {name}", unit=" sentences")
        split_trees = source_trees[name]
        for start in range(0, len(sources), chunk_size):
            chunk_trees = split_trees[start : start + chunk_size] if split_trees is not None else None
            try:
                encoding = processor(sources[start : start + chunk_size],
                                     text_target=targets[start : start + chunk_size], trees=chunk_trees,
                                     max_length=max_length, truncation=True)
            except TreeError as error:  # name the sentence of the split, not of the chunk
                source = "its tree" if error.tree_parser is None else f"tree_parser={error.tree_parser!r}"
                raise ValueError(
                    f"split {name!r}, sentence {start + error.index} ({source}): {error.reason}"
                ) from None
            for key, rows in encoding.items():
                fields.setdefault(key, []).extend(rows)
            progress.update(len(encoding["input_ids"]))
        progress.close()
        fields.pop("attention_mask", None)  # all ones before padding
        torch.save({key: _flatten(key, rows) for key, rows in fields.items()}, output_dir / f"{name}.pt")
        (output_dir / f"{name}.{source_lang}").write_text("\n".join(sources) + "\n", encoding="utf-8")
        (output_dir / f"{name}.{target_lang}").write_text("\n".join(targets) + "\n", encoding="utf-8")
        sizes[name] = len(sources)
    tokenizer = processor.tokenizer
    manifest = {
        "format": PREPARED_FORMAT,
        "data": str(data),
        "source_lang": source_lang,
        "target_lang": target_lang,
        "splits": sizes,
        "max_length": max_length,
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "phrase_levels": processor.phrase_levels,
        "with_syntax": processor.with_syntax,
        "trees": {split: str(path) for split, path in (trees or {}).items()},
        "tree_column": tree_column,
        "derived_trees": derived_tree_source(processor.parser.tree_parser, processor.conversion_path)
        if processor.with_syntax else None,
        # two preparations agree when these do: the joint tokenizer's training is not bit-reproducible
        "fingerprint": prepared_fingerprint(output_dir, list(pairs)),
    }
    (output_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return output_dir


def prepared_fingerprint(folder: str | Path, splits: list[str]) -> str:
    """A hash of every tensor that training and scoring read from a prepared folder's `{split}.pt` files (token ids and
    syntax fields), independent of how `torch.save` lays out its bytes: equal for two preparations of the same
    tokenizer and trees."""
    digest = hashlib.sha256()
    for split in splits:
        stored = torch.load(Path(folder) / f"{split}.pt", weights_only=True)
        for key in sorted(stored):
            for part in ("values", "lengths"):
                tensor = stored[key][part]
                digest.update(f"{split}/{key}/{part}/{tensor.dtype}/{tuple(tensor.shape)}".encode())
                digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def _flatten(key: str, rows: list) -> dict[str, torch.Tensor]:
    """One field of every sentence as a flat tensor (levelled fields as (tokens, K)) plus per-sentence lengths."""
    if key in LEVELLED_SYNTAX_FIELDS:
        values = torch.cat([torch.tensor(levels, dtype=torch.int32).T.reshape(-1, len(levels)) for levels in rows])
    else:
        values = torch.tensor([value for row in rows for value in row], dtype=torch.int32)
    lengths = torch.tensor([len(row[0]) if key in LEVELLED_SYNTAX_FIELDS else len(row) for row in rows])
    small = values.numel() == 0 or (values.min() >= -(2**15) and values.max() < 2**15)
    return {"values": values.to(torch.int16) if small else values, "lengths": lengths.to(torch.int32)}


class PreparedSplit:
    """One split of a prepared folder: per-sentence fields sliced from flat tensors, padded into batches."""

    def __init__(self, path: Path, pad_token_id: int):
        stored = torch.load(path, weights_only=True)
        self.pad_values = {"input_ids": pad_token_id, "labels": -100, **SOURCE_SYNTAX_PAD_VALUES}
        self.fields = {}
        for key, entry in stored.items():
            offsets = torch.zeros(len(entry["lengths"]) + 1, dtype=torch.long)
            offsets[1:] = entry["lengths"].long().cumsum(0)
            self.fields[key] = (entry["values"], offsets)
        self.source_lengths = self.lengths("input_ids")
        self.target_lengths = self.lengths("labels") if "labels" in self.fields else self.source_lengths

    def __len__(self) -> int:
        return len(self.source_lengths)

    def lengths(self, key: str) -> np.ndarray:
        """The length of field `key` (`input_ids`, `labels`, ...) in each sentence, (N,)."""
        return np.diff(self.fields[key][1].numpy())

    def batch(self, indices, device=None, with_labels: bool = True) -> dict[str, torch.Tensor]:
        """The padded batch of `indices`: `input_ids`, `attention_mask`, the syntax fields, and `labels`."""
        batch = {}
        for key, (values, offsets) in self.fields.items():
            if key == "labels" and not with_labels:
                continue
            rows = [values[offsets[i] : offsets[i + 1]].long() for i in indices]
            padded = nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=self.pad_values[key])
            batch[key] = padded.transpose(1, 2).contiguous() if key in LEVELLED_SYNTAX_FIELDS else padded
        lengths = torch.as_tensor(self.source_lengths[list(indices)])
        batch["attention_mask"] = (torch.arange(batch["input_ids"].shape[1])[None] < lengths[:, None]).long()
        return {key: value.to(device) for key, value in batch.items()} if device is not None else batch


class PreparedCorpus:
    """A folder written by [`prepare_corpus`]."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        manifest_path = self.folder / "manifest.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"{self.folder} is not a prepared corpus (no manifest.json): run the prepare step."
            )
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != PREPARED_FORMAT:
            raise ValueError(f"{self.folder} has prepared format {self.manifest.get('format')}, this code reads "
                             f"{PREPARED_FORMAT}: prepare it again.")
        self._splits = {}

    def split(self, name: str) -> PreparedSplit:
        """The split `name` (`train`, `validation`, `test`), loaded once."""
        if name not in self._splits:
            self._splits[name] = PreparedSplit(self.folder / f"{name}.pt", self.manifest["pad_token_id"])
        return self._splits[name]

    def references(self, name: str) -> list[str]:
        """The target sentences of split `name`, one string per sentence (what BLEU is scored against)."""
        path = self.folder / f"{name}.{self.manifest['target_lang']}"
        return path.read_text(encoding="utf-8").rstrip("\n").split("\n")

    def tokenizer(self):
        """The tokenizer the corpus was prepared with (its `tokenizer/` folder)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.folder / "tokenizer")


def token_batches(source_lengths, target_lengths, max_tokens: int, rng: np.random.Generator | None) -> list:
    """Batches of sentence indices holding at most `max_tokens` padded tokens on either side (fairseq's rule),
    grouped by length; with `rng`, lengths are broken by random ties and the batch order is shuffled."""
    longest = np.maximum(source_lengths, target_lengths)
    tie = rng.random(len(longest)) if rng is not None else np.arange(len(longest))
    order = np.lexsort((tie, longest))
    batches, current, current_max = [], [], 0
    for index in order:
        length = int(longest[index])
        if current and max(current_max, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, current_max = [], 0
        current.append(int(index))
        current_max = max(current_max, length)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


# ------------------------------------------------------------------------------------------------ one training run


@dataclass
class Recipe:
    """The optimisation settings of a run (the same for every variant of a comparison)."""

    max_steps: int = 1000
    max_tokens: int = 4096
    learning_rate: float = 7e-4
    warmup_steps: int = 1000
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_epsilon: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    max_grad_norm: float = 1.0
    save_every: int = 500
    average_last: int = 5
    # checkpoints kept on disk (0: the last `average_last`); keeping more lets a comparison be finished at any
    # earlier saved step that every run reached (`max_steps` lowered after the fact)
    keep_checkpoints: int = 0
    eval_every: int = 500
    eval_bleu_samples: int = 0
    num_beams: int = 4
    max_new_tokens: int = 128
    eval_batch_size: int = 128
    bf16: bool = True
    model: dict = field(default_factory=dict)


def inverse_sqrt_schedule(warmup_steps: int):
    """Linear warm-up to the peak, then decay ∝ 1/√step (Vaswani et al., 2017; fairseq's `inverse_sqrt`)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        if step < warmup_steps:
            return step / warmup_steps
        return math.sqrt(warmup_steps / step)

    return factor


def build_model(corpus: PreparedCorpus, recipe: Recipe, row: dict, seed: int):
    """A fresh `MgsaForConditionalGeneration` of the recipe's size with the row's variant fields."""
    from ..configuration_mgsa import MgsaConfig
    from ..modeling_mgsa import MgsaForConditionalGeneration

    manifest = corpus.manifest
    torch.manual_seed(seed)
    config = MgsaConfig(
        vocab_size=manifest["vocab_size"], pad_token_id=manifest["pad_token_id"],
        decoder_start_token_id=manifest["pad_token_id"], eos_token_id=manifest["eos_token_id"],
        forced_eos_token_id=manifest["eos_token_id"],
        max_position_embeddings=max(256, manifest["max_length"] + 2), **{**recipe.model, **row},
    )
    return MgsaForConditionalGeneration(config)


def epoch_batches(split: PreparedSplit, recipe: Recipe, seed: int, epoch: int) -> list:
    """The shuffled token-count batches (sentence indices) of one epoch over `split`, the same for a seed and epoch."""
    rng = np.random.default_rng([seed, epoch])
    return token_batches(split.source_lengths, split.target_lengths, recipe.max_tokens, rng)


def make_optimizer(model, recipe: Recipe):
    """AdamW with the recipe's settings and the inverse-square-root schedule."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, betas=recipe.adam_betas,
                                  eps=recipe.adam_epsilon, weight_decay=recipe.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(recipe.warmup_steps))


def training_step(model, batch: dict[str, torch.Tensor], recipe: Recipe, optimizer, scheduler) -> float:
    """One update on a batch with `labels`: label-smoothed cross-entropy plus the model's auxiliary loss (MG-SA's tag
    loss, weighted by `phrase_tag_loss_weight`), gradient clipping, optimizer and schedule step. Returns the loss."""
    labels = batch.pop("labels")
    batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
    # called without labels, the model would warn that its tag loss is dropped: it is added below
    with caller_adds_tag_loss(model), _autocast(labels.device, recipe):
        outputs = model(**batch)
    tag_loss = outputs.tag_loss.float() if outputs.tag_loss is not None else None
    loss = with_tag_loss(translation_loss(outputs.logits.float(), labels, recipe.label_smoothing), tag_loss,
                         model.config.phrase_tag_loss_weight, labels)
    loss.backward()
    if recipe.max_grad_norm:
        nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _autocast(device: torch.device, recipe: Recipe):
    enabled = recipe.bf16 and device.type == "cuda"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def load_run_state(path: Path, device: torch.device | str = "cpu") -> dict:
    """A run's `state.pt` (weights, optimizer, scheduler, counters, RNG state), read as data only
    (`weights_only=True`): a file that holds anything else is refused, never run.

    Raises:
        `ValueError` naming the file when it is not such a state.
    """
    import pickle

    try:
        return torch.load(path, weights_only=True, map_location=device)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise ValueError(f"{path} is not a training state this package wrote (weights, optimizer, counters), so it "
                         f"is not loaded: remove it to start the run again ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}).") from error


def _save_atomic(state, path: Path) -> None:
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def _log(run_dir: Path, record: dict) -> None:
    with open(run_dir / "log.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


@torch.no_grad()
def validation_loss(model, split: PreparedSplit, device, recipe: Recipe, max_tokens: int) -> float:
    """Token-level cross-entropy (no smoothing) of the split under teacher forcing."""
    model.eval()
    total, count = 0.0, 0
    for indices in token_batches(split.source_lengths, split.target_lengths, max_tokens, None):
        batch = split.batch(indices, device)
        with _autocast(device, recipe):
            logits = model(**batch).logits
        labels = batch["labels"]
        total += nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100,
                                             reduction="sum").item()
        count += int((labels != -100).sum())
    model.train()
    return total / max(count, 1)


@torch.no_grad()
def translate_split(model, split: PreparedSplit, tokenizer, device, recipe: Recipe, limit: int | None = None,
                    num_beams: int | None = None) -> list[str]:
    """Translations of a split in corpus order (batched by length, the model in eval mode)."""
    model.eval()
    count = len(split) if limit is None else min(limit, len(split))
    order = np.argsort(split.source_lengths[:count], kind="stable")
    hypotheses = [""] * count
    for start in range(0, count, recipe.eval_batch_size):
        indices = [int(i) for i in order[start : start + recipe.eval_batch_size]]
        batch = split.batch(indices, device, with_labels=False)
        with _autocast(device, recipe):
            output = model.generate(**batch, num_beams=num_beams or recipe.num_beams,
                                    max_new_tokens=recipe.max_new_tokens)
        for index, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True), strict=True):
            hypotheses[index] = text.strip()
    model.train()
    return hypotheses


def train_run(corpus: PreparedCorpus, run_dir: str | Path, recipe: Recipe, row: dict, seed: int,
              device: str | None = None, threads: int | None = None) -> dict:
    """
    Train one model (`row`: its variant fields) with `recipe` and seed, resuming from `run_dir/state.pt` when a
    previous attempt was interrupted; then average the last checkpoints, translate validation and test with beam
    search and score them. Writes `log.jsonl` (losses as it goes), `{split}.hyp.<lang>` and `result.json`.

    Returns:
        The `result.json` record: `row`, `encoder_type`, `seed`, `steps`, `parameters`, `train_seconds`,
        `steps_per_second`, `hosts` (where it trained: [`host_description`]), and per split
        `{bleu, chrf, distinct_fraction, bleu_signature, chrf_signature}`.
    """
    run_dir = Path(run_dir)
    if (run_dir / "result.json").is_file():
        return json.loads((run_dir / "result.json").read_text())
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"row": row, "seed": seed, "recipe": asdict(recipe)}, indent=2))

    train = corpus.split("train")
    model = build_model(corpus, recipe, row, seed).to(device)
    optimizer, scheduler = make_optimizer(model, recipe)
    step, epoch, position, train_seconds, hosts = 0, 0, 0, 0.0, []
    state_path = run_dir / "state.pt"
    if state_path.is_file():  # resume
        state = load_run_state(state_path, device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, position, train_seconds = state["step"], state["epoch"], state["position"], state["seconds"]
        hosts = state.get("hosts", [])
        torch.set_rng_state(state["rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
    host = host_description(device)
    if host not in hosts:  # a run resumed on another machine lists both
        hosts = hosts + [host]
    model.train()
    batches = epoch_batches(train, recipe, seed, epoch)
    started = time.perf_counter()
    window_loss, window_steps = 0.0, 0
    while step < recipe.max_steps:
        if position >= len(batches):
            epoch, position = epoch + 1, 0
            batches = epoch_batches(train, recipe, seed, epoch)
        loss = training_step(model, train.batch(batches[position], device), recipe, optimizer, scheduler)
        position += 1
        step += 1
        window_loss, window_steps = window_loss + loss, window_steps + 1
        if step % 50 == 0 or step == recipe.max_steps:
            elapsed = train_seconds + time.perf_counter() - started
            _log(run_dir, {"step": step, "epoch": epoch, "loss": round(window_loss / window_steps, 4),
                           "lr": scheduler.get_last_lr()[0], "seconds": round(elapsed, 1)})
            window_loss, window_steps = 0.0, 0
        if step % recipe.eval_every == 0 or step == recipe.max_steps:
            record = {"step": step, "validation_loss": round(validation_loss(
                model, corpus.split("validation"), device, recipe, recipe.max_tokens), 4)}
            if recipe.eval_bleu_samples:
                hypotheses = translate_split(model, corpus.split("validation"), corpus.tokenizer(), device, recipe,
                                             limit=recipe.eval_bleu_samples, num_beams=1)
                references = corpus.references("validation")[: len(hypotheses)]
                record["validation_bleu_greedy"] = round(translation_scores(hypotheses, references)["bleu"], 2)
            _log(run_dir, record)
        if step % recipe.save_every == 0 or step == recipe.max_steps:
            _save_checkpoint(model, run_dir, step, max(recipe.keep_checkpoints, recipe.average_last))
            seconds = train_seconds + time.perf_counter() - started
            _save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(), "step": step, "epoch": epoch, "position": position,
                          "seconds": seconds, "hosts": hosts, "rng": torch.get_rng_state(),
                          "cuda_rng": torch.cuda.get_rng_state() if device.type == "cuda" else None}, state_path)
    train_seconds += time.perf_counter() - started
    return _finish(corpus, run_dir, model, recipe, row, seed, step, train_seconds, device, hosts)


def host_description(device: torch.device) -> str:
    """The machine a run trains on (OS and kernel build, CPU instruction set and cores, or the GPU): a run resumed
    elsewhere lists both, and the quality report says when its steps/s come from different machines."""
    processor = f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    return f"{platform.platform()}, {processor}{gpu}"


def _save_checkpoint(model, run_dir: Path, step: int, keep: int) -> None:
    from safetensors.torch import save_file

    folder = run_dir / "checkpoints"
    # tied weights (shared embeddings, the output layer) are stored once per name
    state = {name: tensor.detach().float().cpu().clone() for name, tensor in model.state_dict().items()}
    save_file(state, folder / f"step-{step}.safetensors")
    for old in _checkpoints(folder)[:-keep]:
        old.unlink()


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.stem.split("-")[1])


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.glob("step-*.safetensors"), key=_step_of)


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """The steps of the checkpoints a run keeps on disk, in order."""
    return [_step_of(path) for path in _checkpoints(Path(run_dir) / "checkpoints")]


def scored_checkpoints(run_dir: str | Path, recipe: Recipe) -> list[Path]:
    """The checkpoints a run is scored with, in order: its last `average_last` up to `max_steps` (a run trained past
    `max_steps`, the comparison finished at an earlier step, is scored at `max_steps`)."""
    checkpoints = [path for path in _checkpoints(Path(run_dir) / "checkpoints") if _step_of(path) <= recipe.max_steps]
    return checkpoints[-recipe.average_last :]


def _finish(corpus, run_dir, model, recipe, row, seed, step, train_seconds, device, hosts) -> dict:
    from ..evaluation import average_checkpoints

    checkpoints = scored_checkpoints(run_dir, recipe)
    steps_per_second = step / max(train_seconds, 1e-9)
    if checkpoints:  # the element-wise mean of the last checkpoints, as the papers decode
        model.load_state_dict(average_checkpoints(checkpoints))
        step = min(step, _step_of(checkpoints[-1]))
    tokenizer = corpus.tokenizer()
    target_lang = corpus.manifest["target_lang"]
    result = {"row": row, "encoder_type": model.config.encoder_type, "seed": seed, "steps": step,
              "parameters": model.num_parameters(), "train_seconds": round(train_seconds, 1),
              "steps_per_second": round(steps_per_second, 3),
              "averaged_checkpoints": [path.stem for path in checkpoints], "num_beams": recipe.num_beams,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "hosts": hosts}
    for split in ("validation", "test"):
        hypotheses = translate_split(model, corpus.split(split), tokenizer, device, recipe)
        (run_dir / f"{split}.hyp.{target_lang}").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
        result[split] = translation_scores(hypotheses, corpus.references(split))
    (run_dir / "log.jsonl").touch()  # a run scored before its first logged step still has its (empty) log
    (run_dir / "result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result
