"""Train with `mgsa_hf.training` under `accelerate launch` and write what this process saw: its rank, the run's
steps, a digest of the vocabulary it trained with, and whether it prepared the corpus and tokenizer itself."""

import hashlib
import json
import sys
from pathlib import Path

from accelerate import PartialState

import mgsa_hf.training.corpus as preparation
from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.run import train


def main() -> None:
    config = load_train_config(sys.argv[1], sys.argv[2:])
    seen = {}
    load_or_train, build_once = preparation.load_or_train_tokenizer, preparation.build_once

    def recording_tokenizer(*args, **kwargs):
        tokenizer = load_or_train(*args, **kwargs)
        vocabulary = json.dumps(sorted(tokenizer.get_vocab().items()))
        seen["vocabulary"] = hashlib.sha256(vocabulary.encode()).hexdigest()
        return tokenizer

    def recording_build(folder, build, is_main, what):
        seen.setdefault("built", []).append(is_main and not preparation.is_prepared(folder))
        return build_once(folder, build, is_main, what)

    preparation.load_or_train_tokenizer, preparation.build_once = recording_tokenizer, recording_build
    results, _ = train(config)
    state = PartialState()
    record = {"rank": state.process_index, "world_size": state.num_processes, "global_step": results["global_step"],
              **seen}
    (Path(config.output_dir).parent / f"rank{state.process_index}.json").write_text(json.dumps(record))
    state.destroy_process_group()  # closes the process group before the interpreter's teardown


if __name__ == "__main__":
    main()
