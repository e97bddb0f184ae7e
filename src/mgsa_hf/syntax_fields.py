"""Names, shapes and padding values of the source-side syntax fields.

The processor makes these tensors, the collator pads them and the model consumes them. Every field is a
`torch.long` tensor aligned with `input_ids` (length `L` = number of source subword tokens, EOS included):

| field | shape | meaning | EOS / special token | padding |
| --- | --- | --- | --- | --- |
| `word_ids` | (B, L) | index of the parser word the token belongs to | its own index, after the last word | -1 |
| `head_word_ids` | (B, L) | word index of the dependency head of the token's word (root: itself) | itself | -1 |
| `phrase_ids` | (B, K, L) | phrase index at granularity level k+1 of the constituency tree, numbered left to right from 0 | its own phrase, after the last one | -1 |
| `phrase_tags` | (B, K, L) | tag id (`PHRASE_TAGS`) of the token's phrase at level k+1 | -100 | -100 |
| `pr_phrase_ids` | (B, L) | phrase index from the PR paper's Algorithm 1 | its own phrase, after the last one | -1 |
| `local_phrase_start` | (B, L) | first token position of the token's local phrase (RHE Rule 1) | its own position | 0 |
| `local_phrase_end` | (B, L) | one past the last token position of that local phrase | its own position + 1 | 0 |
| `tree_depth` | (B, L) | depth of the token's word in the constituency tree (root node = 0) | 0 | 0 |

Two tokens i, j are dependency-related when they belong to the same word or one's word is the other's head;
they share a local phrase (RHE Rules 1 and 2) when j lies in i's local phrase span or i in j's.

Phrase ids are dense per sentence and level: phrases with no token left (a word without subwords, or words cut by
truncation) are skipped, so content tokens use 0 .. P-1 and EOS gets P. Any other special token (and, in a text
without words, every token) is treated like EOS: its own word id (after the last, in order), head, phrase and local
phrase. After truncation `head_word_ids` may name a word that lost its tokens; it is always below the EOS word id.
"""

# field name -> padding value used by the collator
SOURCE_SYNTAX_PAD_VALUES = {
    "word_ids": -1,
    "head_word_ids": -1,
    "phrase_ids": -1,
    "phrase_tags": -100,
    "pr_phrase_ids": -1,
    "local_phrase_start": 0,
    "local_phrase_end": 0,
    "tree_depth": 0,
}

# fields with a leading granularity dimension: (B, K, L) instead of (B, L)
LEVELLED_SYNTAX_FIELDS = ("phrase_ids", "phrase_tags")


def check_syntax_field_names(names=None) -> tuple[str, ...]:
    """`names`, source syntax fields to make (None: all of them), as a tuple in this table's order.

    Raises:
        `ValueError` naming those that are no source syntax field.
    """
    if names is None:
        return tuple(SOURCE_SYNTAX_PAD_VALUES)
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"syntax_fields must be a list of field names, got {names!r}.")
    unknown = [name for name in names if name not in SOURCE_SYNTAX_PAD_VALUES]
    if unknown:
        raise ValueError(f"syntax_fields={list(names)}: {unknown} are no source syntax fields; the fields are "
                         f"{list(SOURCE_SYNTAX_PAD_VALUES)}.")
    return tuple(name for name in SOURCE_SYNTAX_PAD_VALUES if name in names)
