"""The parameters each row file of `configs/<method>/` adds to the Transformer of its size, against its paper's count.

Writes the table between `<!-- parameter-table -->` and `<!-- /parameter-table -->` of each configs README (or, with
`--check`, says which README is out of date). Counts are at Transformer-base (d_model 512, 6 + 6 layers, 8 heads, FFN
2048) unless the file sets Transformer-big's sizes; models are built on the meta device, and the parameters a row adds
do not depend on the vocabulary (`mgsa_hf.benchmarking.rows.parameters_added`). Every row of a paper's tables is
listed: a row that is no model of the package names why in place of a file.

    python scripts/count_row_parameters.py [--check]
"""

import argparse
import re
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mgsa_hf.benchmarking.rows import CONFIGS, config_row, parameters_added  # noqa: E402


# folder → rows: (the paper's table and row, its count added in millions as printed (None: not given), file stem or
# None, what the package's reading is or why it cannot reach the count)
ROWS = {
    "phrase_memory": [
        ("T1-3 Transformer-Base (88.0M)", 0.0, "baseline", ""),
        ("T1 MAX-POOLING, all layers", 0.0, "ngram_max_layers_0-5", ""),
        ("T1 SANs / T2 [1-6]", 2.4, "ngram_sans_layers_0-5", "head-space K/V (default reading)"),
        ("T1 SANs / T2 [1-6]", 2.4, "ngram_sans_layers_0-5_paper_count", "W_q, W_k alone"),
        ("T1 LSTM, all layers", 8.1, "ngram_lstm_layers_0-5", "head-space K/V"),
        ("T1 LSTM, all layers", 8.1, "ngram_lstm_layers_0-5_paper_count", "W_q, W_k alone"),
        ("T2 [1-3]", 1.2, "ngram_sans_layers_0-2", "head-space K/V"),
        ("T2 [1-3]", 1.2, "ngram_sans_layers_0-2_paper_count", "W_q, W_k alone"),
        ("T2 [1] / T3 row 2 N-gram", 0.4, "ngram_sans_layer_0", "head-space K/V"),
        ("T2 [1] / T3 row 2 N-gram", 0.4, "ngram_sans_layer_0_paper_count", "W_q, W_k alone"),
        ("T3 row 3 Syntactic", 0.4, "syntactic", "head-space K/V"),
        ("T3 row 3 Syntactic", 0.4, "syntactic_paper_count", "W_q, W_k alone"),
        ("T3 row 4 + L_tag", 0.4, "syntactic_tag", "head-space K/V"),
        ("T3 row 4 + L_tag", 0.4, "syntactic_tag_paper_count", "W_q, W_k alone"),
        ("T3 row 5 + LSTM", 1.5, "syntactic_tag_lstm", "head-space K/V: +10%"),
        ("T3 row 5 + LSTM", 1.5, "syntactic_tag_lstm_paper_count",
         "W_q, W_k alone (+6.7%; the LSTM's 384 width is fixed by Eq. 8)"),
        ("T3 row 6 / T4 MG-SA (the default)", 1.9, "syntactic_tag_on_lstm", "head-space K/V, chunk 4: −5.5%"),
        ("T3 row 6 / T4 MG-SA", 1.9, "syntactic_tag_on_lstm_paper_count", "W_q, W_k alone, ON-LSTM chunk 2"),
        ("T4 Transformer-Big (264.1M)", 0.0, "big_baseline", ""),
        ("T4 Big + MG-SA", 7.4, "big_syntactic_tag_on_lstm", "head-space K/V, chunk 4 (−5.0%)"),
        ("T4 Big + MG-SA", 7.4, "big_syntactic_tag_on_lstm_paper_count", "W_q, W_k alone, ON-LSTM chunk 2"),
    ],
    "phrase_representation": [
        ("T2 Transformer Base (88.1M)", 0.0, "transformer_base", ""),
        ("T2 +Mean", 40.9, "mean", "W_O folded into W3 (default): −7.6%"),
        ("T2 +Mean", 40.9, "mean_unfolded", "W_O apart (`pr_unfolded_output_projection`)"),
        ("T2 +Max", 40.9, "max", "W_O folded: −7.6%"),
        ("T2 +Max", 40.9, "max_unfolded", "W_O apart"),
        ("T2 +Max+Attn", 84.9, "max_attn", "W_O folded, W1 12·d_model"),
        ("T2 +Max+Attn+TA (T1 +PR; the default)", 84.9, "max_attn_ta", "W_O folded, W1 12·d_model"),
        ("T2 +Max+Attn+TA+Parsing Phrase", 84.9, "max_attn_ta_parse", "W_O folded, W1 12·d_model"),
        ("T2 +Max+Attn+TA, Eq. 8 uncentred", 84.9, "max_attn_ta_uncentred", "W_O folded, W1 12·d_model"),
        ("§3.1 prose: W1 d_model (fewer parameters than the attention)", 84.9, "max_attn_ta_narrow_pooling",
         "W1 2d → d: 2d² per pooling < MHA's 4d², so Table 2's +44.0M for +Attn cannot come out (−51%)"),
        ("not in the paper: W1 and Eq. 8 narrow", None, "max_attn_ta_narrow", ""),
        ("T2 Transformer Big (264.1M)", 0.0, "transformer_big", "the baseline at Big (its +176.0M over Base "
         "includes embeddings, which depend on the vocabulary)"),
    ],
    "hybrid": [
        ("T1 TRANSFORMER (88.0M)", 0.0, "baseline", ""),
        ("T1 + NEIGHBOR (Sperber et al.)", 0.4, None, "a Gaussian-bias baseline of another paper, no model here"),
        ("T1 + LOCAL H (Luong et al.)", 0.4, None, "a Gaussian-bias baseline of another paper, no model here"),
        ("T1 + LOCAL S (Yang et al.)", 0.8, None, "a Gaussian-bias baseline of another paper, no model here"),
        ("T1 + LOCAL PATTERN", 0.0, "local", ""),
        ("T1 + HYBRID (Concate), lowest two layers", 0.3, "concat",
         "W_O over [global ; local] in 2 layers: +75%; no two-layer reading gives 0.3M"),
        ("T1 + HYBRID (Concate), one layer", 0.3, "concat_layer_0",
         "the same in layer 0 alone (−13%), against the paper's two layers"),
        ("T1-4 + HYBRID (Gate), window 3 (the default)", 0.0, "gate", ""),
        ("Fig. 2 gate, window 5", None, "gate_window5", ""),
        ("Fig. 2 gate, window 7", None, "gate_window7", ""),
        ("Fig. 2 gate, window 9", None, "gate_window9", ""),
        ("Fig. 2 gate, window 11", None, "gate_window11", ""),
        ("not in the paper: gate per head", None, "gate_per_head", ""),
    ],
    "rhe": [
        ("T1 Transformer (88.00M WMT14 / 71.82M WMT16)", 0.0, "baseline", ""),
        ("T1 + Rel_Pos (Shaw et al.)", 0.03, None, "relative position keys of another paper (WMT16 71.85M), no "
         "model here (T5's relative bias is a scalar per bucket, not Shaw's vectors)"),
        ("T1 + Localness (Yang et al.)", 0.02, None, "a learned Gaussian bias of another paper (WMT16 71.84M), "
         "no model here"),
        ("T1 + DEA", 0.1, "dea", "DEA adds no parameter; the paper's +0.1M (WMT14) is 0.00M on WMT16"),
        ("T1 + DEA + RHE", 0.1, "dea_rhe", "as + DEA"),
        ("T1 + LPEA", 0.1, "lpea", "+0.005M; the paper's +0.1M (WMT14) is 0.00M on WMT16, i.e. under 0.005M"),
        ("T1 + LPEA + RHE (the default)", 0.1, "lpea_rhe", "as + LPEA"),
        ("T2 + RHE (Prune)", None, "rhe_prune", ""),
        ("T2 Rel_Pos + RHE", None, None, "needs Rel_Pos (above)"),
        ("T2 Localness + RHE", None, None, "needs Localness (above)"),
        ("T3 k = 0", None, "lpea_rhe_k0", ""),
        ("T3 k = 2", None, "lpea_rhe_k2", ""),
        ("T3 k = 4", None, "lpea_rhe_k4", ""),
        ("T3 k = 8", None, "lpea_rhe_k8", ""),
        ("A2 [1-2]", None, "a2_lpea_rhe_layers_1-2", ""),
        ("A2 [1-3]", None, "a2_lpea_rhe_layers_1-3", ""),
        ("A2 [1-4]", None, "a2_lpea_rhe_layers_1-4", ""),
        ("A2 [1-6]", None, "a2_lpea_rhe_layers_1-6", ""),
        ("A2 [4-6]", None, "a2_lpea_rhe_layers_4-6", ""),
        ("gate Eq. 10 as printed", None, "lpea_rhe_sigmoid", ""),
        ("gate: the prose's criterion", None, "lpea_rhe_confidence", ""),
        ("gate learned", None, "lpea_rhe_learned", ""),
        ("not in the paper: out-of-phrase pairs masked", None, "lpea_rhe_mask", ""),
    ],
}
START, END = "<!-- parameter-table -->", "<!-- /parameter-table -->"


# the precision of each paper's printed totals (M): a difference of two of them is known to ± this
ROUNDING = {"phrase_memory": 0.1, "phrase_representation": 0.1, "hybrid": 0.1, "rhe": 0.01}


def verdict(folder: str, paper: float | None, package: int, note: str) -> str:
    """Whether the package's count is within 5% of the paper's (else within the rounding of the paper's two printed
    totals), with the row's note."""
    if paper is None:
        return note
    if package == paper == 0 or (paper and abs(package / (paper * 1e6) - 1) <= 0.05):
        close = "within 5%"
    elif abs(package - paper * 1e6) <= ROUNDING[folder] * 1e6:
        close = f"within the paper's rounding (±{ROUNDING[folder]}M)"
    else:
        close = ""
    return "; ".join(filter(None, [close, note]))


def table(folder: str) -> str:
    lines = ["| row | paper | package | file | within 5%, or the reading and why not |",
             "| --- | --- | --- | --- | --- |"]
    for row, paper, stem, note in ROWS[folder]:
        paper_text = "—" if paper is None else f"+{paper}M"
        if stem is None:
            lines.append(f"| {row} | {paper_text} | — | — | {note} |")
            continue
        package = parameters_added(config_row(f"{folder}/{stem}"))
        check = verdict(folder, paper, package, note)
        lines.append(f"| {row} | {paper_text} | +{package:,} | `{stem}.json` | {check} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only say which README's table is out of date")
    args = parser.parse_args()
    stale = []
    for folder in ROWS:
        readme = CONFIGS / folder / "README.md"
        text = readme.read_text()
        if START not in text:
            raise SystemExit(f"{readme} has no {START} … {END} block.")
        block = f"{START}\n{table(folder)}\n{END}"
        new = re.sub(f"{START}.*?{END}", lambda _, block=block: block, text, flags=re.S)
        if new != text:
            stale.append(str(readme))
            if not args.check:
                readme.write_text(new)
    print("out of date: " + ", ".join(stale) if stale else "every table is up to date")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
