"""Resuming a run of token-count batches under `accelerate launch` (two CPU processes) in the middle of a later epoch
trains on the batches, and ends with the weights, of the uninterrupted run."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mgsa_hf.training.catalogue import accelerate_config_path


SCRIPT = Path(__file__).parent / "scripts" / "resume_token_batches.py"


def test_two_processes_resume_token_batches_exactly_in_a_later_epoch(tmp_path):
    """Checkpointed half way through epoch 2 and resumed by a fresh trainer, the two processes go on with epoch 2's
    batches from the checkpoint on (accelerate's skipping wraps the sampler twice, which then never heard of the
    epoch: it drew epoch 0's order), then epoch 3's, and end with the uninterrupted run's weights, bit for bit."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(accelerate_config_path("cpu_2proc")), "--main_process_port", "29585", str(SCRIPT), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["steps_per_epoch"] >= 4
        assert 2 < rank["checkpoint_epoch"] < 3, f"{rank}"
        assert rank["global_step"] == 3 * rank["steps_per_epoch"] + rank["steps_per_epoch"] // 2
        assert rank["same_batches"], f"{rank}"
        assert rank["equal"] and rank["max_abs_difference"] == 0, f"{rank}"
