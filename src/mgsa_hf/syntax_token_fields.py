"""The syntax fields of one sentence's tokens (see `syntax_fields.py` for their names, shapes and padding), from the
word of each token and the sentence's analysis (`SentenceSyntax`): what [`~mgsa_hf.processing_mgsa.MgsaProcessor`]
makes for every sentence."""

from itertools import groupby

from .syntax_fields import SOURCE_SYNTAX_PAD_VALUES


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


def token_fields(syntax, token_words, levels, tag_vocab, pr_phrases, names=None) -> dict[str, list]:
    """The syntax fields of one sentence's tokens, given the word of each token (-1: special token); `names`, the
    fields to make, as [`~mgsa_hf.syntax_fields.check_syntax_field_names`] returns them for the whole batch (None: all
    of them).

    Phrase ids number the runs of equal tree nodes over the tokens, so phrases without tokens take no id.
    `pr_phrases(tree, content_words)` gives Algorithm 1's phrases as word spans."""
    names = tuple(SOURCE_SYNTAX_PAD_VALUES) if names is None else names
    tree, num_words = syntax.tree, len(syntax.spans)
    specials = [position for position, word in enumerate(token_words) if word < 0]
    if not specials or specials[0] == len(token_words) - len(specials):  # usually: EOS last
        content = token_words[: len(token_words) - len(specials)]
    else:
        content = [word for word in token_words if word >= 0]
    made = {"word_ids": content}
    if "head_word_ids" in names:
        heads = syntax.heads
        made["head_word_ids"] = [heads[word] for word in content]
    if "phrase_ids" in names or "phrase_tags" in names:
        # a word's phrase at level k: its ancestor k steps below the root, or its leaf when that is higher up
        paths = [tree.paths[word] for word in content]
        phrase_nodes = [[path[k] if len(path) > k else path[-1] for path in paths] for k in range(1, levels + 1)]
        made["phrase_ids"] = [_run_ids(nodes) for nodes in phrase_nodes]
        if "phrase_tags" in names:
            node_tags = [tag_vocab[label] for label in tree.label]
            made["phrase_tags"] = [[node_tags[node] for node in nodes] for nodes in phrase_nodes]
    if "pr_phrase_ids" in names:
        phrases = [index for index, (start, end) in enumerate(pr_phrases(tree, content)) for _ in range(start, end)]
        made["pr_phrase_ids"] = _run_ids([phrases[word] for word in content])
    if "local_phrase_start" in names or "local_phrase_end" in names:
        local_phrases, first_token = tree.local_phrases(), _first_tokens(token_words, num_words)
        made["local_phrase_start"] = [first_token[tree.start[local_phrases[word]]] for word in content]
        made["local_phrase_end"] = [first_token[tree.end[local_phrases[word]]] for word in content]
    if "tree_depth" in names:
        paths = tree.paths
        made["tree_depth"] = [len(paths[word]) for word in content]
    fields = {name: made[name] for name in names}
    if specials:
        _insert_special_tokens(fields, specials, num_words)
    return fields


def _insert_special_tokens(fields, positions, num_words):
    """Inserts the values of the special tokens at `positions` (ascending) into the `fields` made: each is its own
    word (and its own head) after the last word, its own phrase after the last phrase, its own local phrase, tag -100,
    depth 0."""
    pr_ids = fields.get("pr_phrase_ids")
    pr_count = pr_ids[-1] + 1 if pr_ids else 0
    phrase_ids, phrase_tags = fields.get("phrase_ids", ()), fields.get("phrase_tags", ())
    phrase_counts = [ids[-1] + 1 if ids else 0 for ids in phrase_ids]
    for rank, position in enumerate(positions):
        for name, value in [
            ("word_ids", num_words + rank),
            ("head_word_ids", num_words + rank),
            ("pr_phrase_ids", pr_count + rank),
            ("local_phrase_start", position),
            ("local_phrase_end", position + 1),
            ("tree_depth", 0),
        ]:
            if name in fields:
                fields[name].insert(position, value)
        for ids, count in zip(phrase_ids, phrase_counts, strict=True):
            ids.insert(position, count + rank)
        for tags in phrase_tags:
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
