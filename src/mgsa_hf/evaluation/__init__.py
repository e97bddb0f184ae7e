"""Offline translation metrics (sacreBLEU BLEU and chrF), the tests between systems (a paired bootstrap over test
sentences, a t-test over training seeds) and checkpoint averaging."""

import json
import re
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from safetensors.torch import load_file

from ..weights_checksums import verify_weights_checksums


# a subword loop: at least five copies of one to three word characters ("erfärmmmmmmmer", "stoligigigigig")
SUBWORD_LOOP = re.compile(r"(\w{1,3}?)\1{4,}")
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacreBLEU's default SACREBLEU_SEED


def translation_scores(predictions: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF of detokenized `predictions` against raw `references`, with sacreBLEU's signatures, the
    fraction of distinct predictions (a model that writes one sentence for every input scores 1 / n) and the fraction
    holding a subword loop ([`SUBWORD_LOOP`])."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references.")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(predictions, [references])
    chrf_score = chrf.corpus_score(predictions, [references])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "distinct_fraction": len(set(predictions)) / max(len(predictions), 1),
        "loop_fraction": loop_fraction(predictions),
    }


def loop_fraction(predictions: list[str]) -> float:
    """The fraction of `predictions` that hold a subword loop ([`SUBWORD_LOOP`]), which an undertrained model writes
    on rare words (0 for none)."""
    return sum(bool(SUBWORD_LOOP.search(text)) for text in predictions) / max(len(predictions), 1)


def paired_bootstrap(baseline: list[list[str]], system: list[list[str]], references: list[str], metric,
                     n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """
    Paired bootstrap resampling (Koehn, 2004) of a system against the baseline, both given as the hypotheses of one
    or more training seeds (paired by position). Each resample draws test sentences with replacement, the same for
    every seed and both systems, and compares the seed-averaged corpus scores.

    With one seed this is sacreBLEU's `paired_bs` test (`PairedTest(..., test_type="bs")`, same resamples, same
    statistic: p = share of resampled |differences|, centred on their mean, above the observed one), except that a
    difference of exactly zero gives p = 1 rather than 1 / (n_samples + 1). sacreBLEU's test takes one hypothesis
    set per system, hence this version for seed averages.

    Returns: `delta` (system − baseline, seed-averaged score), `p_value`, and the 95% bootstrap interval of `delta`.
    """
    if len(baseline) != len(system) or not baseline:
        raise ValueError(f"need the same number (≥ 1) of seeds for both systems, got {len(baseline)} and "
                         f"{len(system)}.")
    for hypotheses in (*baseline, *system):
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    refs = [references]
    indices = np.random.default_rng(seed).choice(len(references), size=(n_samples, len(references)), replace=True)

    # per-sentence statistics summed per resample, as sacreBLEU's own PairedTest does through these two methods; a
    # sacreBLEU without them gets the public corpus_score of every resampled corpus (the same scores, slower)
    statistics_methods = ("_extract_corpus_statistics", "_compute_score_from_stats")
    from_statistics = all(hasattr(metric, name) for name in statistics_methods)

    def scores(hypothesis_sets):
        """Seed-averaged corpus score on the full test set and on every resample."""
        full, resampled = [], []
        for hypotheses in hypothesis_sets:
            if from_statistics:
                stats = np.array(metric._extract_corpus_statistics(hypotheses, refs), dtype="float32")
                full.append(metric._compute_score_from_stats(stats.sum(0)).score)
                resampled.append([metric._compute_score_from_stats(row.sum(0)).score for row in stats[indices]])
            else:
                full.append(metric.corpus_score(hypotheses, refs).score)
                resampled.append([
                    metric.corpus_score([hypotheses[i] for i in row], [[references[i] for i in row]]).score
                    for row in indices
                ])
        return float(np.mean(full)), np.mean(resampled, axis=0)

    base_score, base_samples = scores(baseline)
    sys_score, sys_samples = scores(system)
    observed = abs(sys_score - base_score)
    differences = np.abs(sys_samples - base_samples)
    centred = differences - differences.mean()
    p_value = (np.sum(centred >= observed) + 1) / (n_samples + 1) if observed == 0 else \
        (np.sum(centred > observed) + 1) / (n_samples + 1)
    signed = sys_samples - base_samples
    return {
        "baseline": round(base_score, 2),
        "system": round(sys_score, 2),
        "delta": round(sys_score - base_score, 2),
        "delta_95ci": [round(float(np.percentile(signed, 2.5)), 2), round(float(np.percentile(signed, 97.5)), 2)],
        "p_value": round(float(p_value), 4),
    }


def seed_level_test(baseline: list[float], system: list[float], confidence: float = 0.95,
                    equal_var: bool = True) -> dict:
    """
    Student's two-sample t-test over seed-level scores: each training seed is one observation (its corpus score on
    the whole test set), so the null hypothesis is "the same recipe, another seed": both groups are draws of one
    distribution, with one variance, for which the pooled-variance test is exact when seed scores are normal,
    whatever the number of seeds (2 or more per row). The paired bootstrap above resamples test sentences only; its
    p-value ignores training variance, and on two seeds of one recipe it calls differences of 0.5-0.9 BLEU
    "significant". Welch's unequal-variance form is conservative here (p < 0.05 in about 3% of same-recipe
    comparisons at 3 seeds a row); `scripts/seed_test_calibration.py` measures both rates.

    Args:
        baseline, system: one corpus score per seed (BLEU or chrF), in any order (seeds are not paired).
        confidence: the level of the interval of the difference.

    Returns: `delta` (mean system − mean baseline), its interval `delta_ci`, `p_value` (two-sided), `df` (n₁ + n₂ −
    2, or Welch–Satterthwaite's) and the seed counts; `p_value` and `delta_ci` are None below two seeds on either
    side, where seed variance cannot be estimated.
    """
    from scipy import stats  # the quality benchmark's dependency (dev extra), not the models'

    baseline, system = np.asarray(baseline, dtype=float), np.asarray(system, dtype=float)
    if not len(baseline) or not len(system):
        raise ValueError(f"need at least one seed per system, got {len(baseline)} and {len(system)}.")
    result = {"test": f"{'Student' if equal_var else 'Welch'} t-test over seeds",
              "delta": round(float(system.mean() - baseline.mean()), 2), "seeds": [len(baseline), len(system)],
              "delta_ci": None, "p_value": None, "df": None}
    if min(len(baseline), len(system)) < 2:
        return result
    if np.ptp(baseline) == 0 and np.ptp(system) == 0:
        # no seed variance at all (identical runs): the difference is exact
        result.update(p_value=1.0 if result["delta"] == 0 else 0.0, delta_ci=[result["delta"]] * 2)
        return result
    test = stats.ttest_ind(system, baseline, equal_var=equal_var)
    low, high = test.confidence_interval(confidence)
    result.update(p_value=round(float(test.pvalue), 4), delta_ci=[round(float(low), 2), round(float(high), 2)],
                  df=round(float(test.df), 2))
    return result


def holm_adjusted(p_values: list[float | None]) -> list[float | None]:
    """
    Holm's step-down adjustment of one family of p-values (every row of a table tested against the same baseline):
    a row is called different when its adjusted p is under the level, and the chance that any row of the family is
    called different when none is stays under that level, however many rows the table has. The k-th smallest of m
    p-values becomes max over j ≤ k of min(1, (m − j + 1) · p₍ⱼ₎). Written here because scipy offers only the
    false-discovery-rate adjustments (`scipy.stats.false_discovery_control`), not a family-wise one; statsmodels'
    `multipletests(method="holm")` computes the same and would be a dependency for these lines.

    Args:
        p_values: one p-value per test; None (a row with one seed) is left out of the family and stays None.

    Returns: the adjusted p-values in the order given, rounded to 4 places.
    """
    ranked = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    adjusted, running = [None] * len(p_values), 0.0
    for rank, (p, index) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - rank) * p))
        adjusted[index] = round(running, 4)
    return adjusted


def mean_std(values: list[float]) -> dict:
    """`{"mean", "std", "values"}` of per-seed scores, rounded to 2 places; `std` (sample, ddof 1) is `None` for one
    value."""
    values = np.asarray(values, dtype=float)
    return {"mean": round(float(values.mean()), 2),
            "std": round(float(values.std(ddof=1)), 2) if len(values) > 1 else None,
            "values": [round(float(v), 2) for v in values]}


def encoder_token_spread(model, batch: dict) -> float:
    """
    How different the encoder's output states of the tokens of `batch` are: the mean distance of a token's state
    from the mean of all states, over their mean norm. A model that reads its source keeps its tokens apart (about
    0.95 on Multi30k), while a model that writes one sentence for every input has an encoder that sends every token
    of every sentence out as one vector (0.000: each post-norm layer shrinks what tells tokens apart), so
    cross-attention has nothing to read.

    Args:
        model: a seq2seq model whose output has `encoder_last_hidden_state`.
        batch (`dict`): a collated batch with `attention_mask` and `labels` (its sentences' features, syntax
            fields included when the encoder reads them).
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        states = model(**batch).encoder_last_hidden_state
    model.train(was_training)
    states = states[batch["attention_mask"].bool()].float()
    # all-zero states (a norm with zero weight and bias) tell no token apart either: 0
    return float((states - states.mean(0)).norm(dim=-1).mean() / states.norm(dim=-1).mean().clamp_min(1e-12))


def decode_token_ids(tokenizer, token_ids) -> list[str]:
    """Decode generated ids or labels (where -100 marks ignored positions) to detokenized strings."""
    token_ids = np.asarray(token_ids)
    token_ids = np.where(token_ids < 0, tokenizer.pad_token_id, token_ids)
    return [text.strip() for text in tokenizer.batch_decode(token_ids, skip_special_tokens=True)]


def build_compute_metrics(tokenizer):
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: BLEU and chrF (numbers only)."""

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        scores = translation_scores(
            decode_token_ids(tokenizer, predictions), decode_token_ids(tokenizer, eval_prediction.label_ids)
        )
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute_metrics


def load_safetensors_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint: a `.safetensors` file, or a folder's `model.safetensors` or every shard named by
    its `model.safetensors.index.json` (what `save_pretrained` writes past `max_shard_size`), checked against the
    folder's `weights.sha256` where it has one."""
    folder = Path(folder)
    if folder.suffix == ".safetensors" and folder.is_file():
        return load_file(folder)
    verify_weights_checksums(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        state = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(folder / shard))
        return state
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder} holds no model.safetensors (or sharded index).")
    return load_file(folder / "model.safetensors")


# where accelerate saves an FSDP model's shards when `fsdp_state_dict_type` is `SHARDED_STATE_DICT` (its
# `FSDP_MODEL_NAME` with the model's index): a torch.distributed.checkpoint folder of `.distcp` files and `.metadata`
FSDP_SHARDED_MODEL = "pytorch_model_fsdp_0"


def load_fsdp_sharded_state(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """
    The full weights of a Trainer checkpoint saved under FSDP with `SHARDED_STATE_DICT` (the shipped `fsdp.yaml`),
    read in one process from its `pytorch_model_fsdp_0/` folder, each process's shards joined into whole tensors.

    torch's `dcp_to_torch_save` joins them without a process group; accelerate's `merge_fsdp_weights` does the same
    but waits for every process of the run, and only the main process averages.
    """
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(checkpoint) / FSDP_SHARDED_MODEL
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder} is not a sharded FSDP checkpoint (it has no .metadata).")
    with tempfile.TemporaryDirectory(prefix="mgsa-fsdp-") as scratch:
        dcp_to_torch_save(folder, Path(scratch) / "model.pt")
        state = torch.load(Path(scratch) / "model.pt", map_location="cpu", weights_only=True)
    # accelerate saves `{"model": state_dict}`
    return state["model"] if set(state) == {"model"} else state


def load_checkpoint_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint as [`load_safetensors_state`] reads them or, for a Trainer checkpoint saved under
    FSDP with `SHARDED_STATE_DICT` (no `model.safetensors`), joined from its shards ([`load_fsdp_sharded_state`])."""
    checkpoint = Path(checkpoint)
    safetensors = ("model.safetensors", "model.safetensors.index.json")
    if checkpoint.is_dir() and not any((checkpoint / name).is_file() for name in safetensors) \
            and (checkpoint / FSDP_SHARDED_MODEL / ".metadata").is_file():
        return load_fsdp_sharded_state(checkpoint)
    return load_safetensors_state(checkpoint)


def average_checkpoints(checkpoint_dirs: list[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights of several checkpoints (safetensors files, folders of one file or of shards,
    or Trainer checkpoints of FSDP's sharded state dict: [`load_checkpoint_weights`]), as the papers average the last
    5-20. Integer buffers are taken from the last checkpoint. By hand: no library averages Transformers checkpoints
    (fairseq's `average_checkpoints.py` reads fairseq's own format)."""
    if not checkpoint_dirs:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    state_dicts = [load_checkpoint_weights(folder) for folder in checkpoint_dirs]
    averaged = {}
    for name, last in state_dicts[-1].items():
        if last.is_floating_point():
            averaged[name] = torch.stack([state[name].float() for state in state_dicts]).mean(0).to(last.dtype)
        else:
            averaged[name] = last
    return averaged


def load_checkpoint_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """
    Load `state` (e.g. [`average_checkpoints`] of checkpoints of `model`) into `model`, strictly: every weight a saved
    checkpoint holds must be there, and nothing else. Only the weights `save_pretrained` leaves out may be missing:
    those it rebuilds at load (`_keys_to_ignore_on_save`, the sinusoidal position tables) and those tied to another
    (`lm_head.weight`). A `ValueError` naming the keys and `source` otherwise, before any weight changes (a load with
    `strict=False` would keep the model's own values for them without a word).
    """
    expected = set(model.state_dict())
    not_saved = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    not_saved |= set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or ())
    missing = sorted(expected - not_saved - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        def listed(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

        problems = ([f"lacks {listed(missing)}"] if missing else []) + \
            ([f"holds weights the model has not: {listed(unexpected)}"] if unexpected else [])
        raise ValueError(f"{source} {'; '.join(problems)}: it is not a checkpoint of this model (another "
                         "configuration or run), so its weights cannot be loaded into it.")
    model.load_state_dict(state, strict=False)
