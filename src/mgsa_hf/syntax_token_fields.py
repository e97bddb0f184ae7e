"""The syntax fields of one sentence's tokens (see `syntax_fields.py` for their names, shapes and padding), from the
word of each token and the sentence's analysis (`SentenceSyntax`): what [`~mgsa_hf.processing_mgsa.MgsaProcessor`]
makes for every sentence."""

from itertools import groupby


def token_words(offsets, special_tokens_mask, word_spans) -> list[int]:
    """Word index of each token, -1 for special tokens: the first word its characters overlap, else the next word
    (the last word at the end of the text); -1 too when there are no words."""
    last = len(word_spans) - 1
    word, token_words = 0, []
    for (start, _), special in zip(offsets, special_tokens_mask, strict=True):
        if special:
            token_words.append(-1)
            continue
        while word < last and word_spans[word][1] <= start:
            word += 1
        token_words.append(word if last >= 0 else -1)
    return token_words


def token_fields(syntax, token_words, levels, tag_vocab, pr_phrases) -> dict[str, list]:
    """The syntax fields of one sentence's tokens, given the word of each token (-1: special token).

    Phrase ids number the runs of equal tree nodes over the tokens, so phrases without tokens take no id.
    `pr_phrases(tree, content_words)` gives Algorithm 1's phrases as word spans."""
    tree, num_words = syntax.tree, len(syntax.spans)
    specials = [position for position, word in enumerate(token_words) if word < 0]
    if not specials or specials[0] == len(token_words) - len(specials):  # usually: EOS last
        content = token_words[: len(token_words) - len(specials)]
    else:
        content = [word for word in token_words if word >= 0]
    paths = [tree.paths[word] for word in content]
    # a word's phrase at level k: its ancestor k steps below the root, or its leaf when that is higher up
    phrase_nodes = [[path[k] if len(path) > k else path[-1] for path in paths] for k in range(1, levels + 1)]
    pr_phrases = [
        index
        for index, (start, end) in enumerate(pr_phrases(tree, content))
        for _ in range(start, end)
    ]
    local_phrases, first_token = tree.local_phrases(), _first_tokens(token_words, num_words)
    heads, start, end = syntax.heads, tree.start, tree.end
    node_tags = [tag_vocab[label] for label in tree.label]
    fields = {
        "word_ids": content,
        "head_word_ids": [heads[word] for word in content],
        "phrase_ids": [_run_ids(nodes) for nodes in phrase_nodes],
        "phrase_tags": [[node_tags[node] for node in nodes] for nodes in phrase_nodes],
        "pr_phrase_ids": _run_ids([pr_phrases[word] for word in content]),
        "local_phrase_start": [first_token[start[local_phrases[word]]] for word in content],
        "local_phrase_end": [first_token[end[local_phrases[word]]] for word in content],
        "tree_depth": [len(path) for path in paths],
    }
    if specials:
        _insert_special_tokens(fields, specials, num_words)
    return fields


def _insert_special_tokens(fields, positions, num_words):
    """Inserts the values of the special tokens at `positions` (ascending): each is its own word (and its own
    head) after the last word, its own phrase after the last phrase, its own local phrase, tag -100, depth 0."""
    phrase_counts = [ids[-1] + 1 if ids else 0 for ids in fields["phrase_ids"]]
    pr_count = fields["pr_phrase_ids"][-1] + 1 if fields["pr_phrase_ids"] else 0
    for rank, position in enumerate(positions):
        for name, value in [
            ("word_ids", num_words + rank),
            ("head_word_ids", num_words + rank),
            ("pr_phrase_ids", pr_count + rank),
            ("local_phrase_start", position),
            ("local_phrase_end", position + 1),
            ("tree_depth", 0),
        ]:
            fields[name].insert(position, value)
        for ids, tags, count in zip(fields["phrase_ids"], fields["phrase_tags"], phrase_counts, strict=True):
            ids.insert(position, count + rank)
            tags.insert(position, -100)


def _first_tokens(token_words, num_words) -> list[int]:
    """For each word index 0..num_words, the position of the first token of that word or a later one (one past
    the last word's tokens when there is none)."""
    first, after_last = [], 0
    for position, word in enumerate(token_words):
        if word >= 0:
            first += [position] * (word + 1 - len(first))
            after_last = position + 1
    return first + [after_last] * (num_words + 1 - len(first))


def _run_ids(keys) -> list[int]:
    """Numbers the runs of equal consecutive keys 0, 1, ..."""
    return [run for run, (_, group) in enumerate(groupby(keys)) for _ in group]
