"""Training from raw parallel text to a shareable model folder, with `Seq2SeqTrainer`.

One YAML/JSON config (a packaged recipe, see `mgsa_hf.training.catalogue`, or a file) plus `section.key=value`
overrides → corpus → tokenizer (trained when none is given) → `MgsaProcessor` over the corpus (cached by `datasets`) →
`Seq2SeqTrainer` with BLEU/chrF on validation and best-checkpoint selection → optional checkpoint averaging → test
scores → model, processor and model card saved together. Launch with `accelerate launch` to use several GPUs or
CPU processes.

`output_dir` receives the shareable model folder and nothing else: config, generation config (the recipe's decoding
settings), weights, the model's and the processor's code, the processor's files and the model card, so the whole
folder is what `pipeline(...)` loads and what `hf upload` publishes. What the run keeps for itself (checkpoints, the
trained tokenizer, `results.json`, the translations it scored) goes to the run folder beside it, `<output_dir>-run`
([`run_folder`]).
"""

import json
import logging
import sys
from pathlib import Path

from .config import (
    TrainConfig,
    _backbone_classes,
    _check_init_from,
    _check_run_settings,
    _model_config_fields,
    _typed_training_values,
    apply_threads,
    gradient_accumulation_for_tokens,
    load_train_config,
    source_position_limit,
    validate_model_section,
)
from .corpus import corpus_record
from .cpu_memory import reuse_freed_cpu_memory
from .ownership import own_run_folders, run_folder


logger = logging.getLogger(__name__)


# below this fraction of distinct translations a trained model is reported as not reading its source
COLLAPSED_FRACTION = 0.5


def _accelerator_available() -> bool:
    import torch

    if hasattr(torch, "accelerator"):
        return torch.accelerator.is_available()
    return torch.cuda.is_available()


def _training_arguments(config: TrainConfig):
    """`Seq2SeqTrainingArguments` from the config's `training` section, with best-checkpoint selection on BLEU; the
    checkpoints go to the run folder's `checkpoints/`. `push_to_hub` is not the Trainer's: [`train`] uploads the saved
    model folder instead (the Trainer would upload its checkpoint folder, without the processor, code or card)."""
    import inspect

    from transformers import Seq2SeqTrainingArguments

    allowed = set(inspect.signature(Seq2SeqTrainingArguments).parameters)
    unknown = sorted(set(config.training) - allowed)
    if unknown:
        raise ValueError(f"unknown `training` key(s) {unknown}: they must be Seq2SeqTrainingArguments fields"
                         + ("; `tokens_per_update` is a key of its own, beside `max_tokens_per_batch`"
                            if "tokens_per_update" in unknown else "") + ".")
    config.training = _typed_training_values(config.training)
    fields = {
        "output_dir": str(run_folder(config.output_dir) / "checkpoints"),
        # without an accelerator, train on CPU: processes started by `accelerate launch` then join over gloo
        "use_cpu": not _accelerator_available(),
        "predict_with_generate": True,
        "load_best_model_at_end": config.training.get("eval_strategy", "no") != "no",
        "metric_for_best_model": "bleu",
        "greater_is_better": True,
        **config.training,
        "push_to_hub": False,
    }
    if fields["use_cpu"]:
        _join_cpu_processes(fields.get("ddp_timeout", 1800))
    args = Seq2SeqTrainingArguments(**fields)
    # the processes are known once the arguments have set up the distributed state
    accumulation = gradient_accumulation_for_tokens(config, args.world_size)
    if accumulation is not None:
        args.gradient_accumulation_steps = accumulation
    return args


def tokens_per_update(config: TrainConfig, args) -> int | None:
    """The most tokens (per side) of one optimizer update with token batches: `max_tokens_per_batch` × processes ×
    `gradient_accumulation_steps` (a batch holds at most `max_tokens_per_batch` padded tokens). None for sentence
    batches."""
    if not isinstance(config.max_tokens_per_batch, int) or config.max_tokens_per_batch < 1:
        return None  # sentence batches (a wrong value stops the Trainer, naming the key)
    return config.max_tokens_per_batch * args.world_size * args.gradient_accumulation_steps


def _join_cpu_processes(timeout_seconds: int) -> None:
    """Processes that `accelerate launch` starts on CPU join over gloo with `training.ddp_timeout` as the process
    group's timeout, as they do on GPU (transformers passes it there only; torch's default is 30 minutes)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_seconds))


def build_model(config: TrainConfig, tokenizer):
    """A new model from the `model` section, or `init_from` (an MGSA, Marian or T5 folder) with its fields
    overridden; its config records the tokenizer's vocabulary, which every save of the model carries."""
    from ..weights_checksums import record_tokenizer
    from .conversion import load_as_mgsa

    if config.init_from:
        _check_init_from(config, tokenizer)
        model, new_modules = load_as_mgsa(config.init_from, new_modules_init=config.init_new_modules, **config.model)
        if new_modules:
            logger.info("initialised from %s; new modules (%s): %s", config.init_from, config.init_new_modules,
                        ", ".join(new_modules))
    else:
        config_class, model_class = _backbone_classes(config)
        model = model_class(config_class(**_model_config_fields(config, tokenizer)))
    record_tokenizer(model.config, tokenizer)
    return model


def _references(dataset, lang: str) -> list[str]:
    return [pair[lang] for pair in dataset["translation"]]


def prepare(config: TrainConfig, training_args=None):
    """Corpus, processor and processed splits, prepared once on disk by the main process of the run (the others
    wait for them) and loaded memory-mapped: see [`~mgsa_hf.training.corpus`]."""
    from accelerate import PartialState

    from .corpus import prepare as prepare_once

    return prepare_once(config, is_main=PartialState().is_main_process)


def _set_generation_settings(model, args, generation: dict) -> None:
    """Write the recipe's decoding settings (`generation_num_beams`, `generation_max_length` and the `generation`
    section) into the model's `generation_config`: the run scores with them, and the saved folder decodes with them
    wherever `generate` is called without arguments. Without `generation_max_length` the generation config keeps its
    own length."""
    model.generation_config.num_beams = args.generation_num_beams or 1
    if args.generation_max_length is not None:
        model.generation_config.max_length = args.generation_max_length
    model.generation_config.update(**generation)


def _score_split(trainer, processed, corpus, split: str, config: TrainConfig, tokenizer, shared: bool = False) -> dict:
    """Translate a whole split with the model's generation config (see [`_set_generation_settings`]) and score the
    detokenized output, in corpus order, against the raw references. Sentences are decoded longest first, in batches
    of similar lengths; with `shared` every process of the run (each holding the whole model) decodes every n-th of
    them and all gather the translations, so no process waits for another's whole split. The sources are whole
    (`max_source_length` cuts the training split only), but for those longer than the model's positions: their number
    is `cut_sources`."""
    import numpy as np
    import torch

    from ..evaluation import decode_token_ids, translation_scores
    from .trainer import column_lengths

    model, args = trainer.model.eval(), trainer.args
    targets = [column for column in ("labels", "decoder_attention_mask") if column in processed[split].column_names]
    data = processed[split].remove_columns(targets)
    order = np.argsort(-column_lengths(data, "input_ids"), kind="stable")
    rank, world = (trainer.args.process_index, trainer.args.world_size) if shared else (0, 1)
    mine = order[rank::world]
    predictions = {}
    with torch.no_grad():
        for start in range(0, len(mine), args.per_device_eval_batch_size):
            indices = mine[start:start + args.per_device_eval_batch_size].tolist()
            batch = trainer.data_collator(list(data.select(indices))).to(model.device)
            predictions.update(zip(indices, decode_token_ids(tokenizer, model.generate(**batch).cpu()), strict=True))
    if world > 1:
        everyone = [None] * world
        torch.distributed.all_gather_object(everyone, predictions)
        predictions = {index: text for part in everyone for index, text in part.items()}
    predictions = [predictions[index] for index in range(len(data))]
    scores = translation_scores(predictions, _references(corpus[split], config.target_lang))
    # validation and test are prepared whole, but for sources longer than the model's positions
    limit = source_position_limit(config)
    lengths = [len(ids) for ids in tokenizer(_references(corpus[split], config.source_lang))["input_ids"]]
    cut = sum(length > limit for length in lengths) if limit is not None else 0
    return {"split": split, **scores, "cut_sources": cut, "source_limit": limit, "predictions": predictions}


def _maybe_average(trainer, config: TrainConfig, processed, corpus, tokenizer, claim, shared: bool = False) -> dict:
    """Average the run's last N checkpoints ([`RunClaim.checkpoints`]: safetensors, or FSDP's sharded state dict);
    keep the average when it scores at least as well as the selected model. Where it cannot average, it says why:
    a warning, and `{"skipped": reason}` for the results. With `shared`, every process averages and scores (the
    translations gathered, so every process keeps the same choice)."""
    from ..evaluation import average_checkpoints, load_checkpoint_state
    from .trainer import checkpoint_folders

    folder = Path(trainer.args.output_dir)
    readable = claim.checkpoints(folder)
    checkpoints = readable[-config.average_last_checkpoints :]
    reason = None
    if config.average_last_checkpoints < 2:
        reason = f"average_last_checkpoints={config.average_last_checkpoints} names one checkpoint; it takes 2 or more"
    elif len(checkpoints) < 2:
        reason = (f"{len(checkpoints)} of the run's checkpoints in {folder} hold weights that averaging reads "
                  f"({', '.join(path.name for path in checkpoints) or 'none'}); it takes 2 or more")
        unread = sorted({path.name for path in checkpoint_folders(folder)} - {path.name for path in readable})
        if unread:
            reason += (f"; {', '.join(unread)} hold neither model.safetensors nor FSDP's sharded "
                       "pytorch_model_fsdp_0/, or are another run's")
        else:
            reason += "; save more of them (training.save_steps, training.save_total_limit)"
    elif "validation" not in processed:
        reason = "there is no validation split to score the average against the selected model"
    if reason:
        logger.warning("checkpoint averaging skipped: %s. The selected model is kept.", reason)
        return {"skipped": reason}
    selected = _score_split(trainer, processed, corpus, "validation", config, tokenizer, shared)
    selected_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    load_checkpoint_state(trainer.model, average_checkpoints(checkpoints), f"the average of {checkpoints[0].parent}")
    averaged = _score_split(trainer, processed, corpus, "validation", config, tokenizer, shared)
    kept = averaged["bleu"] >= selected["bleu"]
    if not kept:
        trainer.model.load_state_dict(selected_state)
    return {"checkpoints": [p.name for p in checkpoints], "selected_bleu": selected["bleu"],
            "averaged_bleu": averaged["bleu"], "kept_average": kept}


def _collapse_guard(config: TrainConfig, processed, collator):
    """The [`EncoderCollapseCallback`] of `config` (None without `collapse_check_step` or a validation split): its
    sentences are the first 100 of validation, as the model reads them."""
    from .trainer import EncoderCollapseCallback

    if not config.collapse_check_step or "validation" not in processed:
        return None
    rows = processed["validation"].select(range(min(100, len(processed["validation"]))))
    return EncoderCollapseCallback(collator(list(rows)), config.collapse_check_step, config.collapse_min_spread)


def train(config: TrainConfig, callbacks: list | None = None):
    """Run the whole recipe; returns `(results, model)`: the results written to the run folder's `results.json` and the
    trained model (FSDP: gathered on the main process). `callbacks` are `TrainerCallback`s added to the Trainer. With
    `collapse_check_step`, a run whose encoder has collapsed by that step starts again with the next seed, at most
    `collapse_restarts` times (the results list them under `restarts`). With `training.push_to_hub` the saved model
    folder is uploaded to the Hub repository `training.hub_model_id` (else one named after the folder; the results
    name it as `hub_repo_id`), its card naming the model by that id: last, once the model folder and `results.json`
    are saved, so that a Hub out of reach loses nothing (the error says how to publish the saved folder). The run
    holds its folders from its checks on ([`own_run_folders`]): another run in them stops it at once."""
    training_args = _training_arguments(config)  # validates the `training` section before any work
    _check_run_settings(config)
    validate_model_section(config)
    apply_threads(config)
    keep = {"tokenizer": config.tokenizer, "init_from": config.init_from}
    with own_run_folders(config.output_dir, config.overwrite_output_dir, config.resume_from_checkpoint, keep,
                         training_args.process_index, training_args.world_size) as claim:
        return _train(config, training_args, callbacks, claim)


def _train(config: TrainConfig, training_args, callbacks, claim):
    """The recipe of [`train`], its settings checked and its folders held (`claim`)."""
    import shutil

    from transformers import set_seed

    from ..data_collator import MgsaDataCollator
    from ..evaluation import build_compute_metrics
    from .distributed import (
        check_same_inputs,
        ddp_find_unused_parameters,
        fsdp_modules,
        inputs_fingerprint,
        model_for_main_process,
    )
    from .model_card import build_model_card
    from .trainer import MgsaSeq2SeqTrainer

    if config.reuse_cpu_memory and training_args.use_cpu:
        reuse_freed_cpu_memory()
    update_tokens = tokens_per_update(config, training_args)
    if update_tokens and training_args.process_index == 0:
        logger.info("tokens per update: at most %d per side (%d per batch x %d processes x %d accumulated batches%s)",
                    update_tokens, config.max_tokens_per_batch, training_args.world_size,
                    training_args.gradient_accumulation_steps,
                    f"; tokens_per_update={config.tokens_per_update}" if config.tokens_per_update else "")
    corpus, processor, processed = prepare(config, training_args)
    check_same_inputs(inputs_fingerprint(processor, processed))  # one vocabulary and one corpus on every machine
    tokenizer = processor.tokenizer
    restarts, resume_from_checkpoint = [], config.resume_from_checkpoint
    for attempt in range(config.collapse_restarts + 1):
        set_seed(training_args.seed)  # the new modules' initialisation, as the Trainer seeds the rest
        model = build_model(config, tokenizer)
        training_args.ddp_find_unused_parameters = ddp_find_unused_parameters(model, config.training)
        collator = MgsaDataCollator(tokenizer=tokenizer, model=model)
        guard = _collapse_guard(config, processed, collator) if attempt < config.collapse_restarts else None
        trainer = MgsaSeq2SeqTrainer(  # keeps MG-SA's tag loss under label smoothing
            model=model,
            args=training_args,
            train_dataset=processed["train"],
            eval_dataset=processed["validation"] if "validation" in processed else None,
            data_collator=collator,
            processing_class=tokenizer,
            compute_metrics=build_compute_metrics(tokenizer),
            callbacks=[*(callbacks or []), *([guard] if guard else [])],
            max_tokens_per_batch=config.max_tokens_per_batch,
        )
        train_output = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        if guard is None or not guard.collapsed:
            break
        restarts.append({"seed": training_args.seed, "step": guard.check_step,
                         "encoder_token_spread": round(guard.spread, 4)})
        logger.warning("seed %d: at step %d the encoder sends every token out as nearly one vector (token spread %.4f "
                       "< %.2f), the state of a model that writes one sentence for every input; starting again with "
                       "seed %d.", training_args.seed, guard.check_step, guard.spread, config.collapse_min_spread,
                       training_args.seed + 1)
        trainer.accelerator.wait_for_everyone()
        if trainer.is_world_process_zero():
            shutil.rmtree(training_args.output_dir, ignore_errors=True)  # no checkpoint of the dropped run is kept
        trainer.accelerator.wait_for_everyone()
        training_args.seed += 1
        resume_from_checkpoint = None  # the next seed starts from its own initialisation
    results = {"encoder_type": model.config.encoder_type, "global_step": train_output.global_step,
               "train_loss": train_output.training_loss, "seed": training_args.seed}
    if update_tokens:
        results["tokens_per_update"] = update_tokens
        results["gradient_accumulation_steps"] = training_args.gradient_accumulation_steps
    if restarts:
        results["restarts"] = restarts
    if (cleaned := corpus_record(config).get("dropped")) is not None:
        results["cleaning"] = cleaned
    # every process holds the whole model (DDP): they share the translation of validation and test; under FSDP only
    # the main process holds it whole (gathered) and translates alone
    shared = training_args.world_size > 1 and not fsdp_modules(trainer.model)
    trainer.model = model_for_main_process(trainer.model, training_args.device)  # every process: FSDP gathers it
    if shared or trainer.is_world_process_zero():
        _set_generation_settings(trainer.model, training_args, config.generation)
        if config.average_last_checkpoints:
            results["averaging"] = _maybe_average(trainer, config, processed, corpus, tokenizer, claim, shared)
        scores = [_score_split(trainer, processed, corpus, split, config, tokenizer, shared)
                  for split in ("validation", "test") if split in processed]
        results["scores"] = [{k: v for k, v in row.items() if k != "predictions"} for row in scores]
    if trainer.is_world_process_zero():
        _save(config, trainer, processor, corpus, results, scores, build_model_card)
    trainer.accelerator.wait_for_everyone()
    if config.training.get("push_to_hub") and trainer.is_world_process_zero():
        _publish(config, results)  # every process done and everything saved: a failure here loses nothing
    return results, trainer.model


def _save(config: TrainConfig, trainer, processor, corpus, results: dict, scores: list[dict], build_model_card):
    """Write the model folder (model, processor, card: swapped in whole), then the run's files in the run folder: the
    splits' translations (`<split>.hyp.<target_lang>`) and `results.json`. With `training.push_to_hub`, the card names
    the repository `training.hub_model_id` where it is `org/name`, else a placeholder that [`_publish`] replaces."""
    from ..atomic_saves import MODEL_FILES, PROCESSOR_FILES, staged_folder
    from .model_card import card_dataset, card_repo_id, describe_tree_source

    output_dir = Path(config.output_dir)
    hyperparameters = {key: config.training[key] for key in sorted(config.training)
                       if key in ("learning_rate", "max_steps", "num_train_epochs", "per_device_train_batch_size",
                                  "warmup_steps", "label_smoothing_factor", "lr_scheduler_type")}
    if config.max_tokens_per_batch:  # the batch is counted in tokens, not sentences
        hyperparameters.pop("per_device_train_batch_size", None)
        hyperparameters["max_tokens_per_batch"] = config.max_tokens_per_batch
    hub_model_id = config.training.get("hub_model_id") if config.training.get("push_to_hub") else None
    hub_repo_id = hub_model_id if hub_model_id and "/" in hub_model_id else None  # known before the Hub is reached
    dataset = card_dataset(config.data, config.source_lang, config.target_lang, config.splits.values())
    card = build_model_card(
        trainer.model.config,
        model_id=card_repo_id(hub_repo_id, output_dir.name),  # a placeholder until the folder is pushed
        title=hub_repo_id or output_dir.name,
        init_from=config.init_from,
        slow_tokenizer=getattr(processor.tokenizer, "backend_tokenizer", None) is None,
        source_lang=config.source_lang,
        target_lang=config.target_lang,
        dataset_name=dataset.name,
        dataset_id=dataset.id,
        generation_config=trainer.model.generation_config,
        train_size=len(corpus["train"]),
        hyperparameters=hyperparameters,
        # each split under the name the card's dataset gives it (the Hub's, else the corpus's own), and the corpus's
        # own name (`test_2016_flickr`), which the card's table shows
        results=[{**row, "split": dataset.split_name(config.splits.get(row["split"]) or row["split"]),
                  "corpus_split": config.splits.get(row["split"]) or row["split"]} for row in results["scores"]],
        num_parameters=trainer.model.num_parameters(),
        parser=processor.parser.resolved_name if processor.with_syntax else None,
        tree_source=describe_tree_source(processor.parser.tree_parser, bool(config.trees or config.tree_column)),
    )
    with staged_folder(output_dir, replaces=(*MODEL_FILES, *PROCESSOR_FILES, "README.md")) as staging:
        trainer.model.save_pretrained(staging)  # with the model's code, the translation pipeline's included
        # `truncation=True` (the pipeline's, the processor's) then cuts sources where the scored splits were cut:
        # at the model's positions (the recipe's `max_source_length` cuts the training split only)
        processor.tokenizer.model_max_length = source_position_limit(config) or processor.tokenizer.model_max_length
        processor.save_pretrained(staging)
        card.save(staging / "README.md")
    run_dir = run_folder(output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for row in scores:
        (run_dir / f"{row['split']}.hyp.{config.target_lang}").write_text("\n".join(row["predictions"]) + "\n")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def _publish(config: TrainConfig, results: dict) -> None:
    """Upload the saved model folder whole to the Hub repository `training.hub_model_id` (made if missing; else one
    named after the folder), as `hf upload` would, its card first made to name the repository; `results.json` then
    records it as `hub_repo_id`.

    Raises:
        `OSError`: naming the saved folder and the command that publishes it later, when the Hub cannot be reached or
        refuses the upload.
    """
    import os

    from huggingface_hub import HfApi

    from ..modeling_common import card_for_repository

    output_dir, results_file = Path(config.output_dir), run_folder(config.output_dir) / "results.json"
    name = config.training.get("hub_model_id") or output_dir.name
    try:
        hub = HfApi(token=config.training.get("hub_token"))
        repo_id = hub.create_repo(name, exist_ok=True, private=config.training.get("hub_private_repo")).repo_id
        card_file = output_dir / "README.md"
        card = card_file.read_text(encoding="utf-8")
        if card_for_repository(card, repo_id) != card:  # the placeholder id, now that the repository's is known
            card_file.with_name(".README.md.publishing").write_text(card_for_repository(card, repo_id),
                                                                    encoding="utf-8")
            os.replace(card_file.with_name(".README.md.publishing"), card_file)
        hub.upload_folder(repo_id=repo_id, folder_path=str(output_dir), commit_message="Upload model")
    except Exception as error:
        raise OSError(f"training.push_to_hub: publishing to the Hub repository {name} failed ({type(error).__name__}: "
                      f"{error}). Nothing is lost: the model is saved at {output_dir} and the run's results at "
                      f"{results_file}; publish it later with `hf upload {name} {output_dir}`.") from error
    results["hub_repo_id"] = repo_id
    results_file.write_text(json.dumps(results, indent=2) + "\n")


def translate_examples(output_dir: str | Path, sentences: list[str], **generate_kwargs) -> list[str]:
    """Translate `sentences` with the saved model folder through the translation pipeline, with the decoding settings
    saved in its generation config unless `generate_kwargs` (`num_beams=...`) say otherwise."""
    from transformers import pipeline

    translator = pipeline("translation", model=str(output_dir), device="cpu")
    return [row["translation_text"] for row in translator(list(sentences), **generate_kwargs)]


def run_train(args) -> dict:
    """Entry point of `mgsa-hf train` and `mgsa-hf finetune`: train, report the scores, translate the examples."""
    config_path = args.config
    overrides = list(args.overrides)
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)
        config_path = None
    config = load_train_config(config_path, overrides)
    results, _ = train(config)
    from accelerate import PartialState

    if PartialState().is_main_process:
        for restart in results.get("restarts", []):
            print(f"seed {restart['seed']}: the encoder had collapsed at step {restart['step']} (token spread "
                  f"{restart['encoder_token_spread']:.4f}); trained again with seed {restart['seed'] + 1}")
        if results.get("tokens_per_update"):
            print(f"tokens per update: at most {results['tokens_per_update']} per side "
                  f"(gradient_accumulation_steps={results['gradient_accumulation_steps']})")
        for row in results["scores"]:
            print(f"{row['split']}: BLEU {row['bleu']:.2f}  chrF {row['chrf']:.2f}  "
                  f"{row['distinct_fraction']:.1%} distinct  {row['loop_fraction']:.1%} with a subword loop  "
                  f"({row['bleu_signature']})"
                  + (f"; {row['cut_sources']} sources longer than the model's {row['source_limit']} positions cut"
                     if row.get("cut_sources") else ""))
        collapsed = [row["split"] for row in results["scores"] if row["distinct_fraction"] < COLLAPSED_FRACTION]
        if collapsed:
            message = (f"the model writes the same few sentences for most inputs of {' and '.join(collapsed)} (under "
                       f"{COLLAPSED_FRACTION:.0%} distinct): it learnt the target language but not to read its "
                       "source. Train again with another `training.seed=...`, a lower `training.learning_rate` or "
                       "more steps.")
            print(f"WARNING: {message}", file=sys.stderr)  # once: not also through the logger
        if config.examples:
            translations = translate_examples(config.output_dir, config.examples)
            for source, translation in zip(config.examples, translations, strict=True):
                print(f"  {source}  →  {translation}")
        print(f"model, processor and model card saved to {config.output_dir} (checkpoints, results and translations: "
              f"{run_folder(config.output_dir)})")
        if results.get("hub_repo_id"):
            print(f"uploaded to the Hub: https://huggingface.co/{results['hub_repo_id']}")
    # under `accelerate launch`, close the process group before the interpreter's teardown: a process that exits
    # with it open can abort there ("terminate called without an active exception") after a finished run
    PartialState().destroy_process_group()
    return results
