"""Training and data preparation: from raw parallel text to a shareable model folder.

- `config`: the training config (a recipe with overrides) and its checks; `catalogue`: the named recipes, the papers'
  rows and the `accelerate launch` configs shipped with the package.
- `run`: `train`, the whole run on `Seq2SeqTrainer`; `trainer`: the Trainer subclass, token batches and the collapse
  guard; `prepared`: the same recipes trained by a plain PyTorch loop over a prepared corpus (the benchmarks).
- `corpus` and `data`: the corpus, the tokenizer and the processed splits, prepared once on disk.
- `conversion`: a Marian or T5 checkpoint read as an MGSA model (`init_from`, `mgsa-hf convert`).
- `distributed`, `ownership`, `model_card`: several processes, the run's folders, the card written beside the model.

This package imports the model package (`mgsa_hf`'s top-level modules); the model never imports it.
"""

import importlib

from .config import TrainConfig, load_train_config
from .ownership import run_folder


def __getattr__(name: str):
    # the run (and with it transformers and torch) is imported when first used: `mgsa-hf --help` reads this package
    if name in ("run_train", "train", "translate_examples"):
        return getattr(importlib.import_module(".run", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TrainConfig", "load_train_config", "run_folder", "run_train", "train", "translate_examples"]
