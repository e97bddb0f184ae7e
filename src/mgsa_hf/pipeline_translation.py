"""`pipeline("translation", model=...)` for MGSA models (Transformers 5 has no built-in translation task).

The pipeline runs the model's processor (tokenizer and syntax parser) over a batch of sentences at once, so the
parser works in batches too, then `generate`, then decodes. After `import mgsa_hf` it serves the `translation` task;
a folder saved with [`add_remote_pipeline`] also carries it as the custom task `mgsa-translation`, so that
`pipeline(model=folder, trust_remote_code=True)` works where the package is not installed.
"""

import shutil
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, Pipeline, pipelines
from transformers.pipelines import PIPELINE_REGISTRY


class MgsaTranslationPipeline(Pipeline):
    """
    Translate sentences with an [`MgsaForConditionalGeneration`] (or any seq2seq model whose processor makes its
    inputs). A model that reads no syntax (`encoder_type="transformer"`, or a plain `MarianMTModel`) is served by its
    tokenizer alone when its folder has no processor.

    ```python
    import mgsa_hf
    from transformers import pipeline

    translator = pipeline("translation", model="path/to/model")
    translator("A man rides a bike.", num_beams=4)  # [{"translation_text": "..."}]
    translator(["A dog runs.", "Two girls sing."], batch_size=32)  # one dict per sentence
    ```

    Call arguments: `max_length` / `truncation` for the source (passed to the processor), `batch_size`, and any
    `generate` parameter (`num_beams`, `max_new_tokens`, ...).
    """

    _load_processor = None  # optional: a plain Marian folder has only a tokenizer
    _load_tokenizer = None
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False
    _pipeline_calls_generate = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.processor is None and getattr(self.model.config, "encoder_type", "transformer") != "transformer":
            raise ValueError(
                f"encoder_type={self.model.config.encoder_type!r} reads the source syntax, so the translation "
                "pipeline needs the model's processor (tokenizer + parser): save it beside the model with "
                "`processor.save_pretrained(folder)` or pass `processor=`."
            )
        if self.processor is None and self.tokenizer is None:
            raise ValueError("the translation pipeline needs the model's processor or tokenizer: pass `tokenizer=`.")

    def _sanitize_parameters(self, max_length=None, truncation=None, **generate_kwargs):
        preprocess_params = {}
        if max_length is not None:
            preprocess_params["max_length"] = max_length
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        return preprocess_params, {"generate_kwargs": generate_kwargs}, {}

    def __call__(self, inputs: str | list[str], batch_size: int | None = None, **kwargs):
        """Translate one sentence or a list; returns one `{"translation_text": ...}` per sentence, in a list."""
        sentences = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(sentences, (list, tuple)) or not all(isinstance(s, str) for s in sentences):
            raise TypeError(
                f"the translation pipeline takes a string or a list of strings, got {type(inputs).__name__}."
            )
        preprocess_params, forward_params, _ = self._sanitize_parameters(**kwargs)
        batch_size = batch_size or self._batch_size or 16
        results = []
        for start in range(0, len(sentences), batch_size):
            model_inputs = self.preprocess(list(sentences[start : start + batch_size]), **preprocess_params)
            results.extend(self.postprocess(self.forward(model_inputs, **forward_params)))
        return results

    def preprocess(self, sentences: list[str], max_length=None, truncation=None):
        options = {"return_tensors": "pt"}
        if max_length is not None:
            options.update(max_length=max_length, truncation=True if truncation is None else truncation)
        elif truncation is not None:
            options["truncation"] = truncation
        if self.processor is None:  # a model that reads no syntax, with its tokenizer alone
            return dict(self.tokenizer(sentences, padding=True, **options))
        return dict(self.processor(sentences, **options))

    def _forward(self, model_inputs, generate_kwargs):
        # generation settings given to `pipeline(...)` (kept by the base class: as `_generate_kwargs` in later 5.x
        # releases, among the forward parameters in earlier ones), then those of this call
        settings = {**(getattr(self, "_generate_kwargs", None) or {}),
                    **self._forward_params.get("generate_kwargs", {}), **generate_kwargs}
        return self.model.generate(**model_inputs, **settings)

    def postprocess(self, output_ids):
        texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]


REMOTE_TASK = "mgsa-translation"


def add_remote_pipeline(model, save_directory: str | Path) -> None:
    """Record this pipeline in `model.config.custom_pipelines` (under `mgsa-translation`) and copy its code into
    `save_directory`; call before `model.save_pretrained(save_directory)`. A task name of its own keeps
    `pipeline("translation", model=folder)` on the registered pipeline where the package is installed."""
    model.config.custom_pipelines = {
        REMOTE_TASK: {
            "impl": f"{Path(__file__).stem}.{MgsaTranslationPipeline.__name__}",
            "pt": ("AutoModelForSeq2SeqLM",),
            "type": "text",
        }
    }
    Path(save_directory).mkdir(parents=True, exist_ok=True)
    shutil.copy(__file__, Path(save_directory) / Path(__file__).name)


def register_translation_pipeline() -> None:
    """Register the `translation` task with Transformers' pipeline registry (Transformers 5 lists it as removed)."""
    # Later 5.x releases refuse tasks named in the private `REMOVED_TASKS`; earlier ones (5.17) have no such table.
    removed_tasks = getattr(pipelines, "REMOVED_TASKS", None)
    if isinstance(removed_tasks, dict):
        removed_tasks.pop("translation", None)
    PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=MgsaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
