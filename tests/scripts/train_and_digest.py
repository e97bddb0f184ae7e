"""Train with `mgsa_hf.training` (under `accelerate launch` or alone) and write this process's parameter digest, so a
test can check that every process ends with the same weights."""

import hashlib
import json
import sys
from pathlib import Path

from accelerate import PartialState

from mgsa_hf.training.config import load_train_config
from mgsa_hf.training.run import train


def main() -> None:
    config = load_train_config(sys.argv[1], sys.argv[2:])
    results, model = train(config)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    state = PartialState()
    record = {"rank": state.process_index, "world_size": state.num_processes, "digest": digest.hexdigest(),
              "global_step": results["global_step"]}
    (Path(config.output_dir) / f"rank{state.process_index}.json").write_text(json.dumps(record))
    state.destroy_process_group()  # closes the process group before the interpreter's teardown


if __name__ == "__main__":
    main()
