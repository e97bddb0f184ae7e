"""`pipeline("translation", model=...)` for MGSA models (Transformers 5 has no built-in translation task).

A standard [`~transformers.Pipeline`]: `preprocess` runs the model's processor (tokenizer and syntax parser) on one
sentence, the base class batches sentences (`batch_size`) with [`MgsaDataCollator`]'s padding, `_forward` calls
`generate` with the model's generation config, `postprocess` decodes. After `import mgsa_hf` it serves the
`translation` task; every `save_pretrained` of an MGSA model also writes this file and names it in
`config.custom_pipelines` as the task `mgsa-translation`, so that `pipeline(model=folder, trust_remote_code=True)`
works where the package is not installed.
"""

import collections.abc
import copy
import inspect
import json
import math
import os
import types
from pathlib import Path

from torch.utils.data import DataLoader
from transformers import AutoModelForSeq2SeqLM, Pipeline, pipelines
from transformers.pipelines import PIPELINE_REGISTRY
from transformers.pipelines.base import no_collate_fn
from transformers.pipelines.pt_utils import PipelineDataset, PipelineIterator
from transformers.utils import PROCESSOR_NAME, logging

from .data_collator import MgsaDataCollator
from .generation_arguments import check_counts, check_generation_arguments
from .input_checks import check_tokenizer_fits
from .saved_files import check_processor_files, check_weights_fit_model
from .syntax_spacy import refuse_saved_code
from .tokenization_utils import missing_tokenizer_files
from .weights_checksums import check_tokenizer_record


logger = logging.get_logger(__name__)

# the custom task a saved folder names in `config.custom_pipelines`; a name of its own keeps
# `pipeline("translation", model=folder)` on the registered pipeline where the package is installed
REMOTE_TASK = "mgsa-translation"


class SourceTooLongError(ValueError):
    """A source sentence (`sentence`) of `num_tokens` tokens, more than the model's `limit` positions
    (`max_position_embeddings`), that the translation pipeline was not asked to cut."""

    def __init__(self, sentence: str, num_tokens: int, limit: int):
        super().__init__(
            f"A source sentence has {num_tokens} tokens, more than the model's {limit} positions "
            f"(`max_position_embeddings`): pass `truncation=True` or `max_source_length={limit}` to cut it "
            f"(sentence: {sentence[:60]!r}{'...' if len(sentence) > 60 else ''})."
        )
        self.sentence, self.num_tokens, self.limit = sentence, num_tokens, limit


def refuse_saved_processor_code(folder) -> None:
    """An [`UntrustedCodeError`] when the processor saved in the local `folder` names code to run (the base class
    loads it with the pipeline's `trust_remote_code`, and drops it when that refuses it)."""
    path = Path(folder, PROCESSOR_NAME) if isinstance(folder, (str, os.PathLike)) else None
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(saved, dict):
            refuse_saved_code(saved, folder, option="trust_remote_code=True` to `pipeline(...)")


def missing_processor_packages(folder) -> str | None:
    """Why the processor saved in `folder` (a local folder, or a Hub repository in the cache) did not load, when its
    code (`auto_map` of its processor config, `trust_remote_code`) imports a package that is not installed:
    transformers' own message naming the packages (`dynamic_module_utils.check_imports` of every file of that code);
    else None. The base class drops a processor that fails to load, and this says why."""
    from transformers.dynamic_module_utils import check_imports, get_relative_import_files
    from transformers.utils import cached_file

    try:
        config_file = cached_file(str(folder), PROCESSOR_NAME, local_files_only=True,
                                  _raise_exceptions_for_missing_entries=False)
        saved = json.loads(Path(config_file).read_text(encoding="utf-8")) if config_file else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    reference = (saved.get("auto_map") or {}).get("AutoProcessor") if isinstance(saved, dict) else None
    if not isinstance(reference, str) or "--" in reference:  # no code, or code of another repository
        return None
    module_file = Path(config_file).with_name(f"{reference.rsplit('.', 1)[0]}.py")
    if not module_file.is_file():
        return None
    for code_file in (str(module_file), *get_relative_import_files(str(module_file))):
        try:
            check_imports(code_file)
        except ImportError as error:
            return str(error)
    return None


def reload_saved_processor(folder) -> None:
    """Loads the processor saved in the local `folder` (its `processor_config.json`) again, for the error that made
    the base class drop it: a `ValueError` naming the file, raised from that error. Nothing when it loads, or when
    `folder` holds no saved processor."""
    from transformers import AutoProcessor

    path = Path(folder, PROCESSOR_NAME) if isinstance(folder, (str, os.PathLike)) else None
    if path is None or not path.is_file():
        return
    try:
        AutoProcessor.from_pretrained(folder)
    except Exception as error:
        raise ValueError(f"The processor saved in {folder} ({PROCESSOR_NAME}) did not load: "
                         f"{type(error).__name__}: {error}") from error


def check_batching(batch_size, num_workers) -> None:
    """A `ValueError` naming `batch_size` unless it is a positive integer, or `num_workers` unless it is a
    non-negative one (`None`: the pipeline's default)."""
    check_counts({"batch_size": batch_size, "num_workers": num_workers}, {"batch_size": 1, "num_workers": 0})


class MgsaTranslationPipeline(Pipeline):
    """
    Translate sentences with an [`MgsaForConditionalGeneration`] or [`MgsaT5ForConditionalGeneration`] (or any seq2seq
    model whose processor makes its inputs). A model that reads no syntax (`encoder_type` "transformer" or "hybrid",
    n-gram MG-SA, or a plain `MarianMTModel`) is served by its tokenizer alone. A model folder saved without
    `processor_config.json` gets the processor `MgsaProcessor.from_pretrained` builds there: one that parses nothing
    for a model that reads no syntax; else the default settings with the model's `phrase_levels`, and a warning that
    they need not be those it was trained with. A model object given with a tokenizer and no processor is refused
    when it reads syntax.

    ```python
    import mgsa_hf
    from transformers import pipeline

    translator = pipeline("translation", model="path/to/model")
    translator("A man rides a bike.")  # [{"translation_text": "..."}]
    translator(["A dog runs.", "Two girls sing."], batch_size=32)  # one dict per sentence
    translator(["A dog runs."], num_beams=4, num_return_sequences=2)  # [[{...}, {...}]]: one list per sentence
    for row in translator(KeyDataset(dataset, "en"), batch_size=32):  # streams: [{"translation_text": ...}] each
        ...
    ```

    Inputs: a string, or any iterable of strings: a list or tuple, a `datasets` column (`dataset["en"]`), a
    `KeyDataset`, a generator. A string gives a list of its translations (one dict unless `num_return_sequences` asks
    for more); a list, tuple or column gives a list with one entry per sentence: a dict, or with
    `num_return_sequences > 1` a list of dicts; a `KeyDataset`, generator or other iterator gives an iterator over the
    sentences' lists of dicts (as Transformers' pipelines stream them).

    Decoding follows the model's generation config (`generation_config.json` of its folder: `num_beams`,
    `max_length`, ...) unless told otherwise, by `generate` parameters given to `pipeline(...)` or to the call.

    Call (or `pipeline(...)`) arguments:

    - `max_length`, `max_new_tokens`, `min_length`, `min_new_tokens`, `num_beams`, `num_return_sequences` and any
      other `generate` parameter: bound and steer the OUTPUT, as in `generate` (a warning is logged when a source
      sentence has as many tokens as `max_length` allows the translation, which then may be cut short).
    - `truncation` (`bool`): cut source sentences to the tokenizer's `model_max_length`, or to the model's
      positions (`max_position_embeddings`) where they are fewer, with their syntax fields; by default they are not
      cut, and one longer than the model's positions raises a [`SourceTooLongError`] (a `ValueError`) naming both.
    - `max_source_length` (`int`): cut source sentences to this many tokens (implies `truncation=True`).
    - `batch_size`, `num_workers`, `device`: as for every pipeline; sentences of a batch are padded with the
      processor's pad value of each field, so a batch translates as each sentence alone.
    """

    _load_processor = None  # optional: a plain Marian folder has only a tokenizer
    _load_tokenizer = None
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False
    _pipeline_calls_generate = True

    def __init__(self, *args, **kwargs):
        check_generation_arguments(kwargs)  # before the base class merges them into the generation config
        super().__init__(*args, **kwargs)
        check_weights_fit_model(self.model)  # not a model of random weights under another model's config.json
        if self.processor is None:  # the base class drops a processor that fails to load: say why, if it is trust
            refuse_saved_processor_code(self.model.name_or_path)
            check_processor_files(self.model.name_or_path)  # or a damaged file, named with its line
        # a config without the property is not an MgsaConfig (a plain MarianMTModel or T5): it reads no syntax fields,
        # and neither do the transformer, hybrid attention and n-gram MG-SA, which their tokenizer alone serves
        reads_syntax = getattr(self.model.config, "reads_source_syntax", False)
        if self.processor is None and (self.tokenizer is None or reads_syntax) and self.model.name_or_path:
            # the processor or tokenizer of the model's folder did not load: say which file it lacks
            problem = missing_tokenizer_files(self.model.name_or_path)
            if problem is not None:
                raise OSError(problem)
        if self.processor is None and reads_syntax:
            missing = missing_processor_packages(self.model.name_or_path)
            if missing is not None:
                raise ImportError(f"The processor of {self.model.name_or_path} (tokenizer + parser) did not load: "
                                  f"{missing}")
        if self.processor is None:  # a saved processor that did not load: its own error, not a tokenizer alone
            reload_saved_processor(self.model.name_or_path)
        if self.processor is None and reads_syntax:
            raise ValueError(
                f"encoder_type={self.model.config.encoder_type!r} reads the source syntax, so the translation "
                "pipeline needs the model's processor (tokenizer + parser): save it beside the model with "
                "`processor.save_pretrained(folder)` or pass `processor=`."
            )
        if self.processor is None and self.tokenizer is None:
            raise ValueError("the translation pipeline needs the model's processor or tokenizer: pass `tokenizer=`.")
        if getattr(self.processor, "with_syntax", False) and not reads_syntax:
            self.processor = copy.copy(self.processor)  # it parses nothing the model does not read
            self.processor.with_syntax = False
        # the processor makes the syntax fields the model reads, no others (one of older code makes them all)
        self._syntax_options = {}
        if reads_syntax and "syntax_fields" in inspect.signature(self.processor.__call__).parameters:
            self._syntax_options = {"syntax_fields": self.model.config.source_syntax_fields}
        tokenizer = self.tokenizer if self.processor is None else self.processor.tokenizer
        check_tokenizer_fits(tokenizer, self.model, "the translation pipeline")
        check_tokenizer_record(tokenizer, self.model.config)  # not another model's vocabulary (config.json's record)
        check_batching(self._batch_size, self._num_workers)
        self._collator = None  # made at the first batch: one sentence at a time needs no pad token

    def _sanitize_parameters(self, truncation=None, max_source_length=None, **generate_kwargs):
        preprocess_params = {}
        if truncation is not None:
            if not isinstance(truncation, bool):
                raise ValueError(f"truncation must be True or False, got {truncation!r}.")
            preprocess_params["truncation"] = truncation
        if max_source_length is not None:
            if not isinstance(max_source_length, int) or isinstance(max_source_length, bool) or max_source_length < 1:
                raise ValueError(f"max_source_length must be a positive integer, got {max_source_length!r}.")
            if truncation is False:
                raise ValueError(f"max_source_length={max_source_length} cuts the source, but truncation=False.")
            preprocess_params["max_source_length"] = max_source_length
        check_generation_arguments(generate_kwargs)
        return preprocess_params, generate_kwargs, {}

    def __call__(self, inputs, **kwargs):
        """Translate a sentence or an iterable of sentences (see the class docstring for what each returns)."""
        if isinstance(inputs, tuple) or (
            isinstance(inputs, collections.abc.Sequence) and not isinstance(inputs, (str, list))
        ):
            inputs = list(inputs)  # a tuple or a `datasets` column: a list in, a list out
        elif isinstance(inputs, collections.abc.Iterator) and not isinstance(inputs, types.GeneratorType):
            inputs = (sentence for sentence in inputs)  # streamed, as a generator is
        check_batching(kwargs.get("batch_size"), kwargs.get("num_workers"))
        if isinstance(inputs, list) and not inputs:
            return []
        results = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(translations) == 1 for translations in results):
            return [translations[0] for translations in results]
        return results

    def preprocess(self, sentence, truncation=None, max_source_length=None):
        """The model inputs of one sentence: `input_ids`, `attention_mask` and the processor's syntax fields, each a
        tensor of batch size 1."""
        if not isinstance(sentence, str):
            is_dataset = isinstance(sentence, collections.abc.Mapping) or hasattr(sentence, "column_names")
            hint = " (translate a dataset's text column: `dataset['en']` or `KeyDataset(dataset, 'en')`)"
            raise TypeError(
                f"the translation pipeline translates strings, or iterables of strings; got a "
                f"{type(sentence).__name__}{hint if is_dataset else ''}."
            )
        options = {"return_tensors": "pt"}
        position_limit = getattr(self.model.config, "max_position_embeddings", None)  # T5's relative positions: None
        if max_source_length is not None:
            options.update(max_length=max_source_length, truncation=True)
        elif truncation:
            # the tokenizer's `model_max_length`, or the model's positions where they are fewer
            tokenizer = self.tokenizer if self.processor is None else self.processor.tokenizer
            max_length = min(tokenizer.model_max_length, position_limit or math.inf)
            options.update(max_length=max_length, truncation=True)
        elif truncation is not None:
            options["truncation"] = truncation
        if self.processor is None:  # a model that reads no syntax, with its tokenizer alone
            encoding = self.tokenizer([sentence], **options)
            inputs = {name: encoding[name] for name in ("input_ids", "attention_mask")}
        else:
            inputs = dict(self.processor([sentence], **options, **self._syntax_options))
        num_tokens = inputs["input_ids"].shape[-1]
        if position_limit is not None and num_tokens > position_limit:
            raise SourceTooLongError(sentence, num_tokens, position_limit)
        return inputs

    def get_iterator(self, inputs, num_workers, batch_size, preprocess_params, forward_params, postprocess_params):
        """The base class's iterator, with batches collated by [`MgsaDataCollator`]: every syntax field padded with its
        own value (the base class's collate pads them with 0, and the levelled ones along the wrong axis)."""
        if isinstance(inputs, collections.abc.Sized):
            dataset = PipelineDataset(inputs, self.preprocess, preprocess_params)
        else:
            if num_workers > 1:
                logger.warning("A streamed input is read by one worker: num_workers set to 1.")
                num_workers = 1
            dataset = PipelineIterator(inputs, self.preprocess, preprocess_params)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the base class: the DataLoader may fork workers
        collate_fn = no_collate_fn if batch_size == 1 else self._collate
        loader = DataLoader(dataset, num_workers=num_workers, batch_size=batch_size, collate_fn=collate_fn)
        model_iterator = PipelineIterator(loader, self.forward, forward_params, loader_batch_size=batch_size)
        return PipelineIterator(model_iterator, self.postprocess, postprocess_params)

    def _collate(self, items: list[dict]) -> dict:
        """Pads the `preprocess` outputs of several sentences into one batch."""
        if self._collator is None:
            self._collator = MgsaDataCollator(tokenizer=self.tokenizer)
        return dict(self._collator([{name: values[0] for name, values in item.items()} for item in items]))

    def _forward(self, model_inputs, **generate_kwargs):
        """`generate` on a batch; returns `{"output_ids": (batch, num_return_sequences, length)}`."""
        settings = self._generate_settings(generate_kwargs)
        self._warn_if_output_bound_is_short(model_inputs["attention_mask"], settings)
        output_ids = self.model.generate(**model_inputs, **settings)
        batch_size = model_inputs["input_ids"].shape[0]
        return {"output_ids": output_ids.reshape(batch_size, -1, output_ids.shape[-1])}

    def _generate_settings(self, generate_kwargs: dict) -> dict:
        """The call's `generate` parameters on top of those given to `pipeline(...)`, on top of the model's generation
        config."""
        if hasattr(self, "_prepare_generate_kwargs"):  # Transformers releases that keep `pipeline(...)`'s apart
            return self._prepare_generate_kwargs(generate_kwargs)
        # earlier 5.x releases merge `pipeline(...)`'s into a copy of the model's generation config; the call's go
        # into a copy of that (`generate` deprecates a generation config beside generation parameters)
        generate_kwargs = dict(generate_kwargs)
        generation_config = copy.deepcopy(generate_kwargs.pop("generation_config", None) or self.generation_config)
        model_kwargs = generation_config.update(**generate_kwargs)
        return {"generation_config": generation_config, **model_kwargs}

    def _warn_if_output_bound_is_short(self, attention_mask, settings: dict) -> None:
        config = settings.get("generation_config") or self.model.generation_config
        if settings.get("max_new_tokens", config.max_new_tokens) is not None:
            return
        max_length = settings.get("max_length", config.max_length)
        source_length = int(attention_mask.sum(-1).max())
        if max_length is not None and source_length >= max_length:
            logger.warning_once(
                f"Translations stop at max_length={max_length} tokens (the generation config's, or an argument's), "
                "and a source sentence is as long or longer: its translation may be cut short. Pass a larger "
                "`max_length`, or `max_new_tokens`."
            )

    def postprocess(self, model_outputs):
        """The translations of one sentence: a list of `{"translation_text": ...}`, one per returned sequence."""
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"][0], skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]


def remote_pipelines() -> dict:
    """The `config.custom_pipelines` entry that names this pipeline, as a saved folder's code, under
    `mgsa-translation`."""
    return {
        REMOTE_TASK: {
            "impl": f"{Path(__file__).stem}.{MgsaTranslationPipeline.__name__}",
            "pt": ("AutoModelForSeq2SeqLM",),
            "type": "text",
        }
    }


def register_translation_pipeline() -> None:
    """Register the `translation` task with Transformers' pipeline registry (Transformers 5 lists it as removed)."""
    # Later 5.x releases refuse tasks named in the private `REMOVED_TASKS`; earlier ones (5.17) have no such table.
    removed_tasks = getattr(pipelines, "REMOVED_TASKS", None)
    if isinstance(removed_tasks, dict):
        removed_tasks.pop("translation", None)
    PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=MgsaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
