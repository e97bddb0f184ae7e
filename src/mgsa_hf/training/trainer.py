"""`Seq2SeqTrainer` that keeps the model's auxiliary losses and can batch by token count.

`Seq2SeqTrainer` computes the translation loss itself when `label_smoothing_factor > 0` (its `LabelSmoother`) or when
a `compute_loss_func` is given, from the logits alone: the model's own `loss`, which holds MG-SA's phrase-tag term
λ·L_tag (Hao et al., 2019, Eq. 10; λ = `phrase_tag_loss_weight`), is then dropped and the tag classifier never
trains (the model warns once). [`MgsaSeq2SeqTrainer`] adds the term back in exactly those cases and logs the tag
loss on its own. A plain `Seq2SeqTrainer` without `label_smoothing_factor` trains the model's own loss, which the
model's `label_smoothing` field smooths: that keeps the tag term too.

With `max_tokens_per_batch` it trains on batches of at most that many padded tokens (fairseq's `--max-tokens`, the
batching of the MT papers), drawn in random order, instead of a fixed number of sentences ([`TokenBatchSampler`]).

It also stops, when it is built, two set-ups that the plain Trainer gets wrong: processes started by a launcher that
the training arguments do not join (each trains alone, without a word), and a data collator that cannot pad the
processor's syntax fields (an obscure error at the first batch).
"""

import contextlib
import gc
import inspect
import json
import logging
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import get_int_from_env
from torch.utils.data import DataLoader, Sampler
from transformers import (
    DataCollatorForSeq2Seq,
    DataCollatorWithPadding,
    DefaultDataCollator,
    Seq2SeqTrainer,
    TrainerCallback,
    default_data_collator,
)
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from transformers.trainer_pt_utils import LabelSmoother
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..atomic_saves import disk_full_error, is_disk_full
from ..evaluation import encoder_token_spread
from ..modeling_loss import caller_adds_tag_loss, with_tag_loss
from ..syntax_fields import SOURCE_SYNTAX_PAD_VALUES
from ..target_tokens import at_least_one, target_token_count
from ..weights_checksums import verify_weights_checksums
from .resume_checks import RUN_INPUTS, config_differences, other_run_differences, run_inputs


logger = logging.getLogger(__name__)

# how launchers tell each process how many processes they started: torchrun (which `accelerate launch` runs) sets
# WORLD_SIZE, MPI launchers their own variables (the list accelerate reads)
LAUNCHED_PROCESSES_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")

# transformers' collators that pad only the tokenizer's fields (and `labels`), or none
TOKENIZER_FIELD_COLLATORS = (DataCollatorForSeq2Seq, DataCollatorWithPadding, DefaultDataCollator)

# what torch's checkpoint writer says when a write fails, a full disk among the causes
TORCH_WRITER_FAILURES = ("inline_container.cc", "PytorchStreamWriter failed", "file write failed")
# the Trainer's checkpoint folders and what resuming from one reads (its weights under any of their names)
CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")
CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")


def checkpoint_folders(folder: str | Path) -> list[Path]:
    """The Trainer's `checkpoint-<step>` folders in `folder`, by step (none when `folder` does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if path.is_dir() and CHECKPOINT_FOLDER.match(path.name)]
    return sorted(found, key=lambda path: int(CHECKPOINT_FOLDER.match(path.name).group(1)))


def trainer_state_problems(path: Path) -> list[str]:
    """`[]` when `path` is a Trainer state (`trainer_state.json`, a JSON object with `global_step`), else what is
    wrong with it, naming the file (the Trainer would fail reading it with a bare `JSONDecodeError`)."""
    if not path.is_file():
        return [path.name]
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = "it is empty" if not path.stat().st_size else f"not valid JSON: {error}"
        return [f"a readable {path.name} ({path} is damaged, {reason})"]
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return [f"a readable {path.name} ({path} holds no `global_step`)"]
    return []


def missing_checkpoint_files(checkpoint: str | Path, args, sharded: bool = False) -> list[str]:
    """
    The files that resuming from the Trainer checkpoint `checkpoint` reads and that it lacks, as the Trainer reads
    them: `trainer_state.json`, the model's weights and, unless `args.save_only_model`, the optimizer
    (`optimizer.pt`), the learning-rate schedule (`scheduler.pt`) and the random states (`rng_state*.pth`). The
    Trainer goes on without a word when the last three are missing (a fresh optimizer, the schedule from its start, a
    new data order), as after a save cut short. `sharded`: DeepSpeed or FSDP, which keep the model and optimizer in a
    layout of their own (only the trainer state and random states are checked).
    """
    checkpoint = Path(checkpoint)
    missing = trainer_state_problems(checkpoint / "trainer_state.json")
    if not sharded and not any((checkpoint / name).is_file() for name in CHECKPOINT_WEIGHTS):
        missing.append("model.safetensors")
    if args.save_only_model:
        return missing
    if not sharded:
        if not any((checkpoint / name).is_file() for name in ("optimizer.pt", "optimizer.bin")):
            missing.append("optimizer.pt")
        if not (checkpoint / "scheduler.pt").is_file():
            missing.append("scheduler.pt")
    if not any(checkpoint.glob("rng_state*.pth")):
        missing.append("rng_state.pth")
    return missing


@contextlib.contextmanager
def _cpu_map_location(args):
    """While the Trainer loads a checkpoint's optimizer state in a run of several CPU processes: `torch.load` maps it
    to `"cpu"`. The Trainer maps it to `args.device` whenever the world size is above 1, which under accelerate 1.3 is
    `cpu:0` for a CPU process, a location `torch.load` cannot restore ("don't know how to restore data location"):
    resuming such a run failed there."""
    if not (args.world_size > 1 and args.device.type == "cpu"):
        yield
        return
    load = torch.load

    def load_on_cpu(*arguments, map_location=None, **kwargs):
        if str(map_location).startswith("cpu"):
            map_location = "cpu"
        return load(*arguments, map_location=map_location, **kwargs)

    torch.load = load_on_cpu
    try:
        yield
    finally:
        torch.load = load


def logged_training_loss(log_history: list[dict], global_step: int, from_step: int = 0) -> float | None:
    """
    The mean training loss of steps 1 to `global_step`, from a Trainer's log history: each `loss` entry is the mean
    over the steps since the entry before it, so the run's summed loss is Σ loss × steps. None when the entries do
    not cover those steps: none at `global_step`, or none at `from_step` (the step a run resumed from: the steps
    between the checkpoint's last log and the checkpoint were never logged).
    """
    logged = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry and "step" in entry]
    steps = [0] + [step for step, _ in logged]
    if global_step < 1 or steps[-1] != global_step or from_step not in steps or steps != sorted(set(steps)):
        return None
    return sum(loss * (step - previous) for (step, loss), previous in zip(logged, steps, strict=False)) / global_step


class LogAtCheckpointsCallback(TrainerCallback):
    """
    Logs the training loss at every checkpoint and at the last step (unless `logging_strategy` is `"no"`), so that
    the log history a checkpoint carries covers every step before it: a resumed run's loss over the whole run is
    then its log's ([`logged_training_loss`]).
    """

    def on_step_end(self, args, state, control, **kwargs):
        if args.logging_strategy != "no" and (control.should_save or control.should_training_stop):
            control.should_log = True
        return control

    on_epoch_end = on_step_end


def token_batch_starts(lengths: np.ndarray, counts: np.ndarray, max_tokens: int) -> np.ndarray:
    """
    Where fairseq's batches of at most `max_tokens` padded tokens start in a list of sentences sorted by length: each
    batch takes the next sentences while (its longest length) × (its sentences) stays within `max_tokens`, and a
    sentence longer than that is a batch of its own. Computed per distinct length, not per sentence.

    Args:
        lengths (`np.ndarray` of shape `(distinct_lengths,)`): the distinct lengths, ascending.
        counts (`np.ndarray` of shape `(distinct_lengths,)`): the sentences of each length.
        max_tokens (`int`): the most padded tokens of a batch.

    Returns:
        `np.ndarray` of shape `(batches,)`: the position of each batch's first sentence in the sorted list.
    """
    starts, position, open_size = [], 0, 0  # open_size: the sentences of the last batch, all no longer than `length`
    for length, count in zip(lengths.tolist(), counts.tolist(), strict=True):
        fit = max_tokens // length if length else position + count  # sentences of this length a batch holds
        taken = min(count, max(fit - open_size, 0)) if open_size else 0  # those the open batch still takes
        position, rest = position + taken, count - taken
        open_size += taken
        if rest:  # the others start batches of `fit` sentences (one when a sentence alone is over the limit)
            size = max(fit, 1)
            starts.append(position + size * np.arange(-(-rest // size)))
            position += rest
            open_size = rest - size * (len(starts[-1]) - 1)
    return np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)


class TokenBatchSampler(Sampler):
    """
    Batches of dataset indices holding at most `max_tokens` padded tokens on the source and on the target side
    (sentences grouped by length, as fairseq's `--max-tokens`), in a random order that changes every epoch
    ([`set_epoch`], which the Trainer calls) and repeats for a seed. A sentence longer than `max_tokens` is a batch of
    its own. Unlike the Trainer's `group_by_length`, whose batches run from the longest to the shortest sentences of
    each mega-batch, consecutive batches are independent draws, and short sentences come in larger batches.

    The sentences are sorted by length once, and the batch boundaries fixed then (they depend on the sorted lengths
    alone); each epoch shuffles the sentences of equal length among themselves and the batches' order, with numpy
    (4.5M sentences: well under a second, about 6 bytes a sentence kept).

    Args:
        source_lengths (`Sequence[int]`): tokens of each example's source (`input_ids`).
        target_lengths (`Sequence[int]`): tokens of each example's target (`labels`).
        max_tokens (`int`): the most padded tokens of a batch on either side (longest sentence × sentences).
        seed (`int`): the shuffling seed.
        num_replicas (`int`): the processes the batches are dealt to, whole: each epoch's shuffled batches are cut to
            a multiple of it (the few left over differ from epoch to epoch), so that every process takes as many.
    """

    batch_size = None  # batches vary in size: accelerate deals them whole to the processes
    drop_last = False

    def __init__(self, source_lengths, target_lengths, max_tokens: int, seed: int = 0, num_replicas: int = 1):
        if max_tokens < 1:
            raise ValueError(f"`max_tokens_per_batch` must be a positive number of tokens, got {max_tokens}.")
        source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
        if source_lengths.ndim != 1 or source_lengths.shape != target_lengths.shape:
            raise ValueError("source and target lengths must have one entry per example.")
        longest, rows = np.maximum(source_lengths, target_lengths), len(source_lengths)
        lowest = min(source_lengths.min(), target_lengths.min()) if rows else 0
        if rows and (not np.issubdtype(longest.dtype, np.integer) or lowest < 0):
            raise ValueError(f"source and target lengths must be token counts (integers from 0), got {longest.dtype} "
                             f"values from {lowest}.")
        self.max_tokens, self.seed, self.num_replicas, self.epoch = max_tokens, seed, num_replicas, 0
        if rows and longest.max() < 2**16:  # numpy sorts 16-bit integers by radix
            longest = longest.astype(np.uint16)
        # the sentences by length, ties in index order (each epoch shuffles them), 4 bytes a sentence
        self._sorted = np.argsort(longest, kind="stable").astype(np.int32 if rows < 2**31 else np.int64)
        sorted_lengths = longest[self._sorted]
        # where each run of equal lengths starts in `_sorted` (the first excepted), and where each batch starts
        self._runs = np.flatnonzero(np.diff(sorted_lengths)) + 1
        runs = np.concatenate([[0], self._runs, [rows]]) if rows else np.zeros(1, dtype=np.int64)
        starts = token_batch_starts(sorted_lengths[runs[:-1]], np.diff(runs), max_tokens)
        self._bounds = np.append(starts, rows).astype(np.int64)
        batches = len(self._bounds) - 1
        self._num_batches = batches - batches % num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the next iteration's batch order (as `DistributedSampler.set_epoch`)."""
        self.epoch = epoch

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        order = self._sorted.copy()
        for run in np.split(order, self._runs):  # views: each run of equal lengths shuffled in place
            rng.shuffle(run)
        bounds = self._bounds.tolist()
        for batch in rng.permutation(len(bounds) - 1)[: self._num_batches].tolist():
            yield order[bounds[batch] : bounds[batch + 1]].tolist()

    def __len__(self) -> int:
        return self._num_batches


class TargetlessBatchLabelSmoother(LabelSmoother):
    """The Trainer's `LabelSmoother`, whose loss of a batch without target tokens (every label -100) is 0 with a zero
    gradient instead of 0 / 0 = NaN (which turns every weight NaN in one step while the Trainer logs the loss as 0)."""

    def __call__(self, model_output, labels, shift_labels=False, num_items_in_batch=None):
        if not shift_labels:  # the count the smoother divides by (its own when none is given), at least 1
            num_items_in_batch = at_least_one(target_token_count(labels, num_items_in_batch))
        return super().__call__(model_output, labels, shift_labels, num_items_in_batch)


class EncoderCollapseCallback(TrainerCallback):
    """
    Stops training at `check_step` when the encoder has collapsed: when the spread of its output states over the
    tokens of `batch` (held-out sentences, [`encoder_token_spread`]) is under `min_spread`. Such a run has settled as
    a target-side language model whose encoder sends every token out as one vector, a state it does not leave in the
    steps that follow (`benchmarks/HISTORY.md`, "The default CPU recipe: why it changed, and the collapse probe");
    `mgsa_hf.training.train` then starts again with the next seed. The spread measured is kept in `spread` and
    logged as `encoder_token_spread`.
    """

    def __init__(self, batch: dict, check_step: int, min_spread: float):
        self.batch, self.check_step, self.min_spread = batch, check_step, min_spread
        self.spread, self.collapsed = None, False

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step != self.check_step:
            return
        batch = {name: value.to(model.device) for name, value in self.batch.items()}
        self.spread = encoder_token_spread(model, batch)
        state.log_history.append({"encoder_token_spread": round(self.spread, 4), "step": state.global_step})
        if self.spread < self.min_spread:
            self.collapsed = True
            control.should_training_stop = True
            control.should_save = False


class MgsaSeq2SeqTrainer(Seq2SeqTrainer):
    """
    [`~transformers.Seq2SeqTrainer`] for MGSA models: the training loss is the Trainer's translation loss (label
    smoothed or not) plus `phrase_tag_loss_weight` × the model's `tag_loss` (MG-SA Eq. 10) whenever the model
    returns one; the mean tag loss since the last log is logged as `tag_loss`. Models without auxiliary losses train
    exactly as under `Seq2SeqTrainer`.

    Args:
        max_tokens_per_batch (`int`, *optional*):
            Train on batches of at most this many padded tokens per process and side ([`TokenBatchSampler`], seeded
            by `args.data_seed` or `args.seed`) instead of `per_device_train_batch_size` sentences; the training
            dataset needs `input_ids` and `labels` columns. `train_sampling_strategy` is then not used. The
            `train_samples_per_second` of the training metrics then counts the sentence pairs trained (the Trainer
            counts `per_device_train_batch_size` per batch).

    Raises:
        ValueError: when a launcher (`accelerate launch`, torchrun, mpirun) started several processes but `args`
            see one (on a machine without GPUs, `use_cpu` not set: each process would train alone on all the data),
            or when a dataset holds the processor's syntax fields and the data collator is one of transformers' that
            pads only the tokenizer's fields (use [`MgsaDataCollator`]).

    Resuming ([`train`]) refuses a checkpoint that lacks what resuming reads ([`missing_checkpoint_files`]), where
    the Trainer would go on with a fresh optimizer; `resume_from_checkpoint=True` takes the newest complete checkpoint
    of `args.output_dir`, with a warning naming the incomplete ones after it. The training loss is logged at every
    checkpoint ([`LogAtCheckpointsCallback`]), so a resumed run's `training_loss` is the mean over the whole run
    (the Trainer's leaves out the steps before the resume). A checkpoint that cannot be written for want of space, and
    an `optimizer.pt` or `scheduler.pt` cut short, raise errors naming the checkpoint folder or the file.
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        if self.label_smoother is not None:
            self.label_smoother = TargetlessBatchLabelSmoother(self.label_smoother.epsilon,
                                                               self.label_smoother.ignore_index)
        self._tag_loss_total = None
        self._tag_loss_count = 0
        self._pairs_trained = 0
        self._check_processes_joined()
        self._check_collator_pads_syntax_fields()
        self.add_callback(LogAtCheckpointsCallback)

    def _check_processes_joined(self) -> None:
        launched = get_int_from_env(LAUNCHED_PROCESSES_ENV, 1)
        if launched > 1 and self.args.world_size == 1:
            raise ValueError(
                f"The launcher started {launched} processes, but the training arguments see one "
                "(`args.world_size == 1`), so each process would train its own copy of the model on all the data. "
                "Without GPUs the Trainer joins the processes only when it trains on CPU: set `use_cpu=True` in "
                "the Seq2SeqTrainingArguments (or ACCELERATE_USE_CPU=1 in the launcher's environment)."
            )

    def _check_collator_pads_syntax_fields(self) -> None:
        if not (isinstance(self.data_collator, TOKENIZER_FIELD_COLLATORS) or
                self.data_collator is default_data_collator):
            return
        model_inputs = inspect.signature(self.accelerator.unwrap_model(self.model).forward).parameters
        eval_datasets = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"evaluation": self.eval_dataset}
        for name, dataset in {"training": self.train_dataset, **eval_datasets}.items():
            fields = [field for field in _column_names(dataset) if field in SOURCE_SYNTAX_PAD_VALUES]
            if self.args.remove_unused_columns:  # the Trainer drops the columns the model does not read
                fields = [field for field in fields if field in model_inputs]
            if fields:
                collator = getattr(self.data_collator, "__name__", type(self.data_collator).__name__)
                raise ValueError(
                    f"The {name} dataset holds the processor's syntax fields {fields}, which the data collator "
                    f"{collator} does not pad (batching fails with 'Unable to create tensor'): pass "
                    "`data_collator=MgsaDataCollator(processor.tokenizer, model=model)`, which pads every field with "
                    "its own value."
                )

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer._save_checkpoint`; a write that fails for want of space raises an `OSError` (`ENOSPC`) naming the
        cause and the checkpoint folder (torch's writer says only "unexpected pos" or "file write failed"). The
        checkpoint also records the run's vocabulary and training data ([`RUN_INPUTS`]), which resuming compares."""
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        try:
            super()._save_checkpoint(model, trial)
            if self.args.should_save and folder.is_dir():
                (folder / RUN_INPUTS).write_text(json.dumps(self._run_inputs(), indent=2) + "\n", encoding="utf-8")
        except (OSError, RuntimeError) as error:
            if not (is_disk_full(error) or any(text in str(error) for text in TORCH_WRITER_FAILURES)):
                raise
            existing = next(path for path in (folder, *folder.parents) if path.exists())
            free = shutil.disk_usage(existing).free
            raise disk_full_error(error, folder, "writing the checkpoint", f"{free} bytes are free there. The "
                                  "checkpoint is incomplete: delete it, free space or keep fewer checkpoints "
                                  "(`save_total_limit`), and resume") from error

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """`Trainer._load_optimizer_and_scheduler`; a file cut short or damaged (`optimizer.pt`, `scheduler.pt`: not
        the zip archive `torch.save` writes, or one whose data fails its CRC: a flipped bit) raises a `ValueError`
        naming it. Several CPU processes load the optimizer
        state onto the CPU ([`_cpu_map_location`])."""
        files = [Path(checkpoint) / name for name in (OPTIMIZER_NAME, SCHEDULER_NAME)] if checkpoint else []
        # torch.load reads past a flipped bit in a tensor's data: the archive's CRCs are checked first
        if damaged := [path for path in files if path.is_file() and _damaged_archive(path)]:
            raise ValueError(f"{damaged[0]} cannot be read (not a whole `torch.save` archive): it was cut short or "
                             "damaged (a save that stopped?). Resume from an earlier checkpoint.")
        with _cpu_map_location(self.args):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """`Trainer._load_rng_state`, which reads `rng_state*.pth` with `torch.load(weights_only=True)`: a file that
        holds other objects (a pickle of code) or is cut short raises a `ValueError` naming it, not torch's bare
        unpickling error."""
        try:
            super()._load_rng_state(checkpoint)
        except Exception as error:
            files = sorted(Path(checkpoint).glob("rng_state*.pth"))
            if not files:
                raise
            raise ValueError(f"{', '.join(map(str, files))}: not the random states the Trainer saves "
                             f"({type(error).__name__}: {' '.join(str(error).split())[:300]}); the file is damaged or "
                             "was replaced. Resume from an earlier checkpoint, or delete the file to resume without "
                             "the saved random states.") from error

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """`Trainer._load_from_checkpoint`, the checkpoint's weights first checked against its `weights.sha256`
        ([`verify_weights_checksums`]): the Trainer reads them with safetensors, which checks a file's header, not its
        data, so a damaged checkpoint trained on without a word."""
        _check_saved_weights(resume_from_checkpoint, "resuming from", "Resume from an earlier checkpoint.")
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        except RuntimeError as error:  # torch's page of "size mismatch for ..." lines, naming no setting
            if "size mismatch" not in str(error):
                raise
            changed = ", ".join(config_differences(resume_from_checkpoint, (model or self.model).config))
            raise ValueError(f"resuming from {resume_from_checkpoint}: its weights do not fit the model the recipe "
                             f"builds ({changed or 'other sizes'}). Resume with the run's own model settings, or "
                             "train into another output_dir.") from error

    def _load_best_model(self) -> None:
        """`Trainer._load_best_model` (`load_best_model_at_end`), the best checkpoint's weights checked first."""
        _check_saved_weights(self.state.best_model_checkpoint, "loading the best model of",
                             "Train again, or load another checkpoint.")
        super()._load_best_model()

    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if not hasattr(self.train_dataset, "__len__"):
            raise TypeError(f"`max_tokens_per_batch` groups sentences of similar lengths over the whole training set, "
                            f"which a {type(self.train_dataset).__name__} (a stream) does not give: save it as a "
                            "`datasets.Dataset` (`mgsa-hf prepare`, or `Dataset.from_generator`), which is read "
                            "memory-mapped, or train it with sentence batches (`max_tokens_per_batch` unset).")
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        missing = sorted({"input_ids", "labels"} - set(getattr(dataset, "column_names", None) or ()))
        if missing:
            raise ValueError(f"`max_tokens_per_batch` batches a `datasets.Dataset` by its `input_ids` and `labels` "
                             f"lengths; the training dataset has no {missing} column.")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        lengths = [column_lengths(dataset, column) for column in ("input_ids", "labels")]
        sampler = TokenBatchSampler(*lengths, self.max_tokens_per_batch, seed, num_replicas=self.args.world_size)
        # the Trainer's own log states `per_device_train_batch_size`, which these batches do not use
        logger.info("training batches of at most %d tokens: %d per epoch, %.1f sentences on average",
                    self.max_tokens_per_batch, len(sampler), len(dataset) / len(sampler))
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                            num_workers=self.args.dataloader_num_workers, pin_memory=self.args.dataloader_pin_memory,
                            persistent_workers=self.args.dataloader_persistent_workers)
        # the batches have no one size, and the sampler gives every process as many: accelerate is to deal them
        # whole, not pad the last round (which accelerate before 1.4 refuses for batches without a size)
        even_batches = self.accelerator.even_batches
        self.accelerator.even_batches = False
        try:
            return self.accelerator.prepare(loader)
        finally:
            self.accelerator.even_batches = even_batches

    def _run_epoch(self, model, epoch, train_dataloader, *args, **kwargs):
        """`Trainer._run_epoch`, the [`TokenBatchSampler`] told the epoch first. The Trainer tells its data loader
        and the batch sampler the loader holds; resuming in the middle of an epoch under several processes, it trains
        on a loader whose batch sampler is accelerate's `SkipBatchSampler` around its `BatchSamplerShard` around
        ours, which then kept epoch 0 and dealt epoch 0's batches instead of the uninterrupted run's.

        Resumed from a checkpoint at `max_steps` (a run stopped while saving its model after its last checkpoint), it
        trains no step: the Trainer checks `max_steps` only after a step, and from a checkpoint in the middle of an
        epoch went on with that epoch's next batch, one step past `max_steps`."""
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        for sampler in batch_samplers(train_dataloader):
            if isinstance(sampler, TokenBatchSampler):
                sampler.set_epoch(epoch)
        return super()._run_epoch(model, epoch, train_dataloader, *args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`, resuming only from a complete checkpoint of this run (a checkpoint of another run stops
        it before any step, [`_check_same_run`]); a resumed run's `training_loss` (and the metrics' `train_loss`) is
        the mean over every step of the run."""
        self._pairs_trained = 0
        checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
        if checkpoint is not None:
            self._check_same_run(checkpoint)
        output = super().train(checkpoint, *args, **kwargs)
        if checkpoint is None:
            return output
        resumed_step = json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"]
        loss = logged_training_loss(self.state.log_history, self.state.global_step, resumed_step)
        if loss is None:
            logger.warning("the log history does not cover every step of the run (logging_strategy 'no', or no loss "
                           "logged at step %d of %s): training_loss is the Trainer's, which leaves out the steps "
                           "before the resume.", resumed_step, checkpoint)
            return output
        return output._replace(training_loss=loss, metrics={**output.metrics, "train_loss": loss})

    def end_training(self) -> None:
        """Ends a script's training under a launcher: releases the distributed wrapper of the model and then closes
        the process group (`accelerator.end_training()`). `self.model` stays usable.

        Releasing the wrapper first matters: its gradient reducer holds the group, and when the reducer frees the
        group last (as the script's objects are freed at exit), torch's gloo backend joins its worker threads while
        holding Python's lock, which one of them may need to finish: the process can hang after a finished run
        (pytorch/pytorch#56297).
        """
        self.accelerator.free_memory()  # drops the accelerator's references to the wrapped model and optimizer
        self.model_wrapped = self.model
        gc.collect()  # the reducer is freed here, while the group is still open
        self.accelerator.end_training()

    def _run_inputs(self) -> dict:
        """The run's vocabulary and training data digests ([`run_inputs`]), computed once."""
        if getattr(self, "_run_inputs_record", None) is None:
            self._run_inputs_record = run_inputs(self.processing_class, self.train_dataset)
        return self._run_inputs_record

    def _check_same_run(self, checkpoint: str) -> None:
        """Before any step: a `ValueError` naming the checkpoint and what differs when it belongs to another run
        (another backbone, encoder type, sizes, vocabulary or training data, [`other_run_differences`])."""
        if self.model is None:  # `model_init`: the model is built in `train`
            return
        config = self.accelerator.unwrap_model(self.model).config
        differences = other_run_differences(checkpoint, config, self._run_inputs())
        if differences:
            raise ValueError(f"resume_from_checkpoint={checkpoint!r}: the checkpoint belongs to another run "
                             f"(the checkpoint's -> this run's): {'; '.join(differences)}. Resume with that run's "
                             "model settings, vocabulary and data; or start this run without resuming (another "
                             "output_dir), or fine-tune from the checkpoint (init_from).")

    def _checkpoint_to_resume(self, resume_from_checkpoint: str | bool | None) -> str | None:
        """The checkpoint folder to resume from: `True` → the newest complete one in `args.output_dir`."""
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        sharded = self.is_deepspeed_enabled or self.is_fsdp_enabled
        if resume_from_checkpoint is True:
            folder = Path(self.args.output_dir)
            found = checkpoint_folders(folder)
            if not found:
                raise FileNotFoundError(f"resume_from_checkpoint=True: there is no checkpoint (checkpoint-<step> "
                                        f"folder) in {folder} to resume from.")
            incomplete = []
            for checkpoint in reversed(found):
                missing = missing_checkpoint_files(checkpoint, self.args, sharded)
                if not missing:
                    if incomplete and self.is_world_process_zero():
                        logger.warning("resume_from_checkpoint=True: resuming from %s, the newest complete "
                                       "checkpoint; skipped (a save cut short?): %s.", checkpoint,
                                       "; ".join(incomplete))
                    return str(checkpoint)
                incomplete.append(f"{checkpoint.name} lacks {', '.join(missing)}")
            raise ValueError(f"resume_from_checkpoint=True: no checkpoint in {folder} holds what resuming reads: "
                             f"{'; '.join(incomplete)}.")
        checkpoint = Path(resume_from_checkpoint)
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"resume_from_checkpoint={str(checkpoint)!r}: no such checkpoint folder.")
        missing = missing_checkpoint_files(checkpoint, self.args, sharded)
        if missing:
            raise ValueError(f"resume_from_checkpoint={str(checkpoint)!r} lacks {', '.join(missing)} (a save cut "
                             "short?): resumed from it, the run would go on with a fresh optimizer, schedule or "
                             "random state. Resume from an earlier checkpoint.")
        return str(checkpoint)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # the Trainer recomputes the loss from the logits in these two cases, leaving the model's own loss aside
        recomputed = (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs
        unwrapped = self.accelerator.unwrap_model(model)
        labels = inputs.get("labels")  # the Trainer pops them when it recomputes the loss
        # the model, called without labels, would warn that its tag loss is left out: this class adds it back
        with caller_adds_tag_loss(unwrapped, recomputed):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
        if model.training and "input_ids" in inputs:
            self._pairs_trained += len(inputs["input_ids"])
        tag_loss = outputs.get("tag_loss") if isinstance(outputs, dict) else None
        if tag_loss is not None:
            if recomputed:
                # the translation loss is a mean over this batch's target tokens, or already this batch's share of
                # the accumulated batch's (then the tag term takes the same share: the same count of tokens)
                scaled = self._translation_loss_scaled_for_accumulation(num_items_in_batch)
                loss = with_tag_loss(loss, tag_loss.to(loss.dtype), unwrapped.config.phrase_tag_loss_weight, labels,
                                     num_items_in_batch if scaled else None)
            if model.training:
                detached = tag_loss.detach().float()
                self._tag_loss_total = detached if self._tag_loss_total is None else self._tag_loss_total + detached
                self._tag_loss_count += 1
        return (loss, outputs) if return_outputs else loss

    def _accumulation_steps(self) -> int:
        return getattr(self, "current_gradient_accumulation_steps", None) or self.args.gradient_accumulation_steps

    def _translation_loss_scaled_for_accumulation(self, num_items_in_batch) -> bool:
        """Mirrors `Trainer.training_step`: whether the loss it is given is already normalised over the whole
        accumulated batch (then it is not divided by the accumulation steps)."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return bool(scaled)
        return bool(self.model_accepts_loss_kwargs and num_items_in_batch is not None) or \
            self.compute_loss_func is not None

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self._tag_loss_count and "loss" in logs:  # training logs only, not evaluation ones
            total = self._tag_loss_total
            if self.args.world_size > 1:
                total = self.accelerator.reduce(total.to(self.args.device), reduction="mean")
            logs["tag_loss"] = round(float(total) / self._tag_loss_count, 4)
            self._tag_loss_total, self._tag_loss_count = None, 0
        if self.max_tokens_per_batch is not None and "train_samples_per_second" in logs and logs.get("train_runtime"):
            # the Trainer counts `per_device_train_batch_size` pairs per batch; `logs` is also the dict that `train`
            # returns as its metrics, so both read the pairs trained
            pairs = self._pairs_trained
            if self.args.world_size > 1:
                pairs = int(self.accelerator.reduce(torch.tensor(pairs, device=self.args.device), reduction="sum"))
            logs["train_samples_per_second"] = round(pairs / logs["train_runtime"], 3)
        super().log(logs, *args, **kwargs)


def _check_saved_weights(checkpoint: str, doing: str, advice: str) -> None:
    """[`verify_weights_checksums`] of a checkpoint folder, its error saying what was being done."""
    try:
        verify_weights_checksums(checkpoint)
    except ValueError as error:
        raise ValueError(f"{doing} {checkpoint}: {error} {advice}") from None


def _damaged_archive(path: Path) -> bool:
    """Whether `path` is not the zip archive `torch.save` writes, or holds a member whose data fails its CRC."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is not None
    except (zipfile.BadZipFile, OSError, EOFError):
        return True


def batch_samplers(loader) -> list:
    """The batch sampler of `loader` and those it wraps, outermost first: accelerate's wrappers
    (`BatchSamplerShard`, `SkipBatchSampler`) keep the batch sampler they wrap as `batch_sampler`."""
    found, sampler = [], getattr(loader, "batch_sampler", None)
    while sampler is not None and not any(sampler is seen for seen in found):
        found.append(sampler)
        sampler = getattr(sampler, "batch_sampler", None)
    return found


def column_lengths(dataset, column: str) -> np.ndarray:
    """The length of each row's list in `column` of a `datasets.Dataset`, read from Arrow's offsets (no row is
    decoded: 4.5M rows take about a second, where Python lists take minutes and gigabytes)."""
    import pyarrow.compute as pc

    return pc.list_value_length(dataset.with_format("arrow")[column]).to_numpy(zero_copy_only=False)


def _column_names(dataset) -> list[str]:
    """The fields of a `datasets.Dataset`, or of the first row of a list of dicts; none for other datasets."""
    names = getattr(dataset, "column_names", None)
    if names is None and isinstance(dataset, list) and dataset and isinstance(dataset[0], dict):
        names = list(dataset[0])
    return list(names or ())


__all__ = ["EncoderCollapseCallback", "LogAtCheckpointsCallback", "MgsaSeq2SeqTrainer", "TokenBatchSampler",
           "checkpoint_folders", "logged_training_loss", "missing_checkpoint_files"]
