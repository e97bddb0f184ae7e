"""Constituency parser plug-ins for the tests, built on the package's own spaCy parse: the derived tree with every
noun phrase flattened (the words of an NP hang directly under it), so their trees differ visibly from the derived
ones while staying real parses of the text.

* [`flat_np_tree`]: a callable plug-in, `tree_parser="tree_plugins:flat_np_tree"`.
* `mgsa_test_flat_np_trees`: a spaCy component (benepar-style) that sets each sentence's PTB string as
  `span._.flat_np_parse`; `parser_code="tree_plugins"` registers it when a saved pipeline is loaded.
* [`tree_without_last_word`]: a plug-in whose trees leave out the last word, which the processor must refuse.
"""

from spacy.language import Language
from spacy.tokens import Span

from mgsa_hf.constituency_conversion import default_conversion
from mgsa_hf.syntax_parser import SyntaxParser
from mgsa_hf.syntax_spacy import word_arrays
from mgsa_hf.syntax_trees import ConstituencyTree


EXTENSION = "flat_np_parse"
COMPONENT = "mgsa_test_flat_np_trees"
_PARSER = SyntaxParser()


def flatten_noun_phrases(tree: ConstituencyTree) -> ConstituencyTree:
    """`tree` with the words of each top-most NP directly under it (its inner phrases removed)."""
    paths = []
    for path in tree.paths:
        top = next((depth for depth, node in enumerate(path[:-1]) if tree.label[node] == "NP"), None)
        paths.append(path if top is None else path[: top + 1] + path[-1:])
    return ConstituencyTree(paths, list(tree.label))


def flat_np_tree(text: str) -> str | None:
    """The PTB tree of `text` with flat noun phrases; `None` (the processor's own tree) for a text without words."""
    syntax = _PARSER([text])[0]
    if not syntax.words:
        return None
    return flatten_noun_phrases(syntax.tree).to_ptb(syntax.words)


def tree_without_last_word(text: str) -> str | None:
    """A tree over all words of `text` but the last (for a text of two or more words): not a parse of the text."""
    words = _PARSER([text])[0].words[:-1]
    return "(S " + " ".join(f"(X {word})" for word in words) + ")" if words else None


if not Span.has_extension(EXTENSION):
    Span.set_extension(EXTENSION, default=None)


@Language.component(COMPONENT)
def set_flat_np_parses(doc):
    """Sets `span._.flat_np_parse` on every sentence: its derived tree with flat noun phrases (as benepar sets
    `span._.parse_string`). Needs the tagger and parser before it."""
    for sentence in doc.sents:
        sentence_doc = sentence.as_doc()
        heads, tags, deps, spans = word_arrays(sentence_doc)
        if not heads:
            continue
        words = [sentence_doc.text[start:end] for start, end in spans]
        tree = flatten_noun_phrases(default_conversion().tree(heads, tags, deps))
        sentence._.set(EXTENSION, tree.to_ptb(words))
    return doc


# seconds that `slow_tree` takes per sentence
SLOW_TREE_SECONDS = 0.5


def slow_tree(text: str) -> None:
    """The processor's own tree (`None`), after `SLOW_TREE_SECONDS`: a parse that takes long."""
    import time

    time.sleep(SLOW_TREE_SECONDS)
