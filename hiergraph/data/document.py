r"""Documents as signal hierarchies: document → paragraphs → sentences → tokens.

A document is split into paragraphs (blank lines, or IMDB's ``<br /><br />``),
paragraphs into sentences (after ``.``, ``!`` or ``?`` followed by white
space), and sentences into token ids by a tokenizer. Every family is a 1-D
grid: a node's position is its index among its siblings (Amizadeh et al.,
Sec. 4.1, App. I).

Building happens in three steps, so that datasets can cache the expensive
first one and apply caps and depth cheaply on access:

1. :func:`tokenize_document` → :class:`TokenizedDocument` (token ids plus the
   number of tokens of every sentence and of sentences of every paragraph);
2. :meth:`TokenizedDocument.truncate` applies length caps per level and
   returns a :class:`Truncation` report (what was cut, never silently);
3. :func:`hierarchy_from_lengths` builds the :class:`SignalHierarchy`
   (vectorised) with ``depth`` 3 (paragraphs, sentences, tokens), 2
   (sentences, tokens) or 1 (tokens only, the flat sequence).

:func:`document_hierarchy` runs all three.

Tokenizers: :class:`SimpleTokenizer` (built in: lower-cased words and
punctuation, a vocabulary fitted on a corpus), or any Hugging Face tokenizer
passed in (a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``);
:func:`as_encoder` turns either into a ``list[str] -> list[list[int]]`` batch
encoder without special tokens.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hiergraph._checks import check_int
from hiergraph._runs import ramp
from hiergraph.data.signal_hierarchy import SignalHierarchy, as_long

#: Paragraph breaks: a blank line, or HTML line breaks (``<br />``) repeated.
PARAGRAPH_BREAK = re.compile(r"\n\s*\n|(?:<br\s*/?>\s*){2,}", re.IGNORECASE)
#: Sentence breaks: white space after ``.``, ``!`` or ``?`` (optionally closed by quotes/brackets).
SENTENCE_BREAK = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")
_SINGLE_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)

DEPTHS = (1, 2, 3)


# --------------------------------------------------------------- tokenizers
class SimpleTokenizer:
    r"""A built-in word tokenizer: lower-cased words, numbers and single punctuation marks.

    A word is a run of letters and digits of any script (``café``, ``zürich``,
    ``москва``), with an apostrophe ending (``don't``); the text is composed first
    (Unicode NFC), so that an accent typed as a separate mark joins its letter. Every
    other character but white space is a token of its own. Scripts whose words hold marks
    that no composed letter has (such as Devanagari's vowel signs) are cut at the marks:
    use a Hugging Face tokenizer for them.

    Ids: ``0`` is padding (unused by the builders), ``1`` is the unknown
    token, words follow by decreasing corpus frequency (ties broken
    alphabetically, so the vocabulary is deterministic).

    Example::

        tok = SimpleTokenizer.fit(["A cat.", "A dog!"], max_size=100)
        tok.encode("a cat?")   # [2, 3, 1]: '?' is unknown

    Args:
        vocab: the words, in id order starting at 2.
    """

    PAD, UNK = 0, 1
    PATTERN = re.compile(r"[^\W_]+(?:['’][^\W\d_]+)?|\S")
    #: The version of the word rule (:attr:`PATTERN`): a dataset cache records the one it
    #: was built with and is rebuilt under another (version 1 took ASCII letters only).
    RULE = 2

    def __init__(self, vocab: Sequence[str]):
        self.vocab = list(vocab)
        self.index = {w: i + 2 for i, w in enumerate(self.vocab)}
        if len(self.index) != len(self.vocab):
            raise ValueError("the vocabulary has repeated words")

    @classmethod
    def fit(
        cls, texts: Iterable[str], max_size: int | None = 30000, min_freq: int = 1
    ) -> SimpleTokenizer:
        """The ``max_size`` most frequent words (``None``: all) seen at least ``min_freq``
        times in ``texts`` (a list of texts, not one str)."""
        _check_texts(texts)
        check_int(max_size, "max_size", optional=True)  # (-1 dropped the rarest word)
        counts = Counter(w for text in texts for w in cls.split(text))
        kept = (w for w, c in counts.items() if c >= min_freq)
        words = sorted(kept, key=lambda w: (-counts[w], w))
        return cls(words[:max_size] if max_size is not None else words)

    @classmethod
    def split(cls, text: str) -> list[str]:
        """The word strings of ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"a text must be a str, got {type(text).__name__}: {text!r}")
        return cls.PATTERN.findall(unicodedata.normalize("NFC", text).lower())

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (unknown words → ``1``)."""
        return [self.index.get(w, self.UNK) for w in self.split(text)]

    def __len__(self) -> int:
        """The number of ids (padding and unknown included)."""
        return len(self.vocab) + 2

    @property
    def name(self) -> str:
        return f"simple{len(self)}"

    def __repr__(self) -> str:
        return f"SimpleTokenizer(vocab_size={len(self)})"


def as_encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    """A batch encoder ``texts -> token ids`` (no special tokens) for any supported tokenizer.

    Accepts a :class:`SimpleTokenizer`, a ``tokenizers.Tokenizer`` (its
    ``encode_batch`` runs in parallel), a ``transformers`` tokenizer, or a
    plain callable ``str -> list[int]``.

    Raises:
        TypeError: for anything else.
    """
    if isinstance(tokenizer, SimpleTokenizer):
        return lambda texts: [tokenizer.encode(t) for t in texts]
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "get_vocab_size"):
        # tokenizers.Tokenizer: Encoding objects with .ids
        return lambda texts: [
            e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)
        ]
    if hasattr(tokenizer, "convert_tokens_to_ids") and callable(tokenizer):
        # transformers.PreTrainedTokenizer(Fast)
        return lambda texts: (
            tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        )
    if callable(tokenizer):
        return lambda texts: [list(tokenizer(t)) for t in texts]
    raise TypeError(
        f"tokenizer must be a SimpleTokenizer, a Hugging Face tokenizer (transformers or "
        f"tokenizers) or a callable str -> list[int], got {type(tokenizer).__name__}"
    )


def _check_texts(texts) -> None:
    """Raise a ``TypeError`` for one ``str`` where a collection of texts belongs (it would be
    read character by character)."""
    if isinstance(texts, str):
        raise TypeError(
            f"texts must be a list of texts, got a str ({texts[:20]!r}); wrap one text in a "
            f"list: [text]"
        )


# ------------------------------------------------------------ segmentation
def split_paragraphs(text: str) -> list[str]:
    """Paragraphs of ``text``: split at blank lines and repeated ``<br />``; empty ones dropped."""
    parts = PARAGRAPH_BREAK.split(text)
    return [p for p in (_SINGLE_BR.sub(" ", p).strip() for p in parts) if p]


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of a paragraph: split after ``.``, ``!``, ``?`` followed by white space."""
    return [s for s in (s.strip() for s in SENTENCE_BREAK.split(paragraph)) if s]


# --------------------------------------------------------------- structure
@dataclass
class Truncation:
    """What the length caps cut from one document (all counts are of removed items, by
    every cap together: a paragraph whose sentences all fell to ``max_tokens`` counts as
    removed, one that keeps a token does not).

    Attributes:
        paragraphs: paragraphs removed whole.
        sentences: sentences removed whole (those of removed paragraphs included).
        tokens: tokens removed.
        raw_tokens: the number of tokens before truncation.
    """

    paragraphs: int = 0
    sentences: int = 0
    tokens: int = 0
    raw_tokens: int = 0

    @property
    def truncated(self) -> bool:
        return self.tokens > 0

    def as_tensor(self) -> Tensor:
        """``[1, 4]`` long (paragraphs, sentences, tokens, raw_tokens); a batch gives ``[B, 4]``."""
        return torch.tensor([[self.paragraphs, self.sentences, self.tokens, self.raw_tokens]])


def check_caps(**caps: int | None) -> None:
    """Raise unless every cap is a positive int (NumPy's too) or ``None``: a
    :class:`TypeError` for a non-int, a :class:`ValueError` for one below 1."""
    for name, cap in caps.items():
        check_int(cap, name, optional=True)


@dataclass
class TokenizedDocument:
    """A tokenized document in compact form.

    Attributes:
        ids: ``[T]`` long token ids, in reading order.
        sentence_lengths: ``[S]`` tokens per sentence (all ``>= 1``), summing to ``T``.
        paragraph_sizes: ``[P]`` sentences per paragraph (all ``>= 1``), summing to ``S``.
    """

    ids: Tensor
    sentence_lengths: Tensor
    paragraph_sizes: Tensor

    def __post_init__(self):
        for name in ("ids", "sentence_lengths", "paragraph_sizes"):
            value = as_long(getattr(self, name), name)
            if value.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
            setattr(self, name, value)
        if self.ids.numel() == 0:
            raise ValueError("a document needs at least one token")
        if bool((self.ids < 0).any()):  # (an embedding lookup would wrap or fail later)
            raise ValueError(f"ids must be token ids >= 0, got {int(self.ids.min())}")
        if int(self.sentence_lengths.sum()) != self.ids.numel():
            raise ValueError(
                f"sentence_lengths sum to {int(self.sentence_lengths.sum())} but there are "
                f"{self.ids.numel()} tokens"
            )
        if int(self.paragraph_sizes.sum()) != self.sentence_lengths.numel():
            raise ValueError(
                f"paragraph_sizes sum to {int(self.paragraph_sizes.sum())} but there are "
                f"{self.sentence_lengths.numel()} sentences"
            )
        for name in ("sentence_lengths", "paragraph_sizes"):
            if bool((getattr(self, name) < 1).any()):
                raise ValueError(f"{name} must all be >= 1 (drop empty sentences/paragraphs)")

    @property
    def num_tokens(self) -> int:
        return self.ids.numel()

    def truncate(
        self,
        max_paragraphs: int | None = None,
        max_sentences: int | None = None,
        max_sentence_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> tuple[TokenizedDocument, Truncation]:
        """Apply length caps (``None``: no cap) and report what was cut.

        Applied top-down: the first ``max_paragraphs`` paragraphs, the first
        ``max_sentences`` sentences of each paragraph, the first
        ``max_sentence_tokens`` tokens of each sentence, then the first
        ``max_tokens`` tokens of the document (the sentence holding the cut
        keeps its head). Returns the capped document and a :class:`Truncation`.
        """
        check_caps(
            max_paragraphs=max_paragraphs,
            max_sentences=max_sentences,
            max_sentence_tokens=max_sentence_tokens,
            max_tokens=max_tokens,
        )
        if max_paragraphs is max_sentences is max_sentence_tokens is max_tokens is None:
            return self, Truncation(raw_tokens=self.num_tokens)
        sizes, lengths = self.paragraph_sizes, self.sentence_lengths
        para_of_sent = _group_ids(sizes, lengths.numel())
        first_sent = torch.cumsum(sizes, 0) - sizes
        rank_in_para = torch.arange(lengths.numel()) - first_sent[para_of_sent]
        keep_sent = torch.ones(lengths.numel(), dtype=torch.bool)
        if max_paragraphs is not None:
            keep_sent &= para_of_sent < max_paragraphs
        if max_sentences is not None:
            keep_sent &= rank_in_para < max_sentences
        new_lengths = lengths.clone()
        if max_sentence_tokens is not None:
            new_lengths = new_lengths.clamp(max=max_sentence_tokens)
        new_lengths = torch.where(keep_sent, new_lengths, 0)
        if max_tokens is not None:
            end = torch.cumsum(new_lengths, 0)
            new_lengths = (new_lengths - (end - max_tokens).clamp(min=0)).clamp(min=0)
        # token mask: token t of sentence s is kept if its rank in s is below new_lengths[s]
        sent_of_tok = _group_ids(lengths, self.num_tokens)
        rank_in_sent = (
            torch.arange(self.num_tokens) - (torch.cumsum(lengths, 0) - lengths)[sent_of_tok]
        )
        keep_tok = rank_in_sent < new_lengths[sent_of_tok]
        kept = new_lengths > 0
        new_sizes = torch.zeros_like(sizes).index_add_(0, para_of_sent, kept.long())
        report = Truncation(
            paragraphs=int((new_sizes == 0).sum()),
            sentences=int((~kept).sum()),
            tokens=self.num_tokens - int(keep_tok.sum()),
            raw_tokens=self.num_tokens,
        )
        if report.tokens == 0:
            return self, report
        return (
            TokenizedDocument(self.ids[keep_tok], new_lengths[kept], new_sizes[new_sizes > 0]),
            report,
        )


def _group_ids(sizes: Tensor, total: int) -> Tensor:
    """``[total]`` group id of every item for consecutive groups of ``sizes`` items.

    (``output_size`` avoids a reduction that is slow under CPU contention.)
    """
    return torch.arange(sizes.numel()).repeat_interleave(sizes, output_size=total)


def tokenize_documents(
    texts: Sequence[str], tokenizer, encoder: Callable | None = None
) -> list[TokenizedDocument | None]:
    """Segment and tokenize many documents in one batched tokenizer call.

    See :func:`tokenize_document`.

    Args:
        texts: the documents, a sequence of ``str`` (a single text goes in a list).
        tokenizer: see :func:`as_encoder`; unused when ``encoder`` is given.
        encoder: optional batch encoder ``list[str] -> list[list[int]]`` that returns one
            token list per sentence (default: ``as_encoder(tokenizer)``).

    Returns:
        one :class:`TokenizedDocument` per text; a document without any token gives
        ``None``.

    Raises:
        TypeError: if ``texts`` is one ``str`` or holds a document that is not a ``str``.
        ValueError: if ``encoder`` returns a number of token lists other than the number
            of sentences.
    """
    _check_texts(texts)
    encoder = encoder or as_encoder(tokenizer)
    sentences, sizes_per_doc = [], []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"documents must be str, got {type(text).__name__}")
        sizes = []
        for paragraph in split_paragraphs(text):
            sents = split_sentences(paragraph)
            sentences += sents
            sizes.append(len(sents))
        sizes_per_doc.append(sizes)
    encoded = encoder(sentences)
    if len(encoded) != len(sentences):  # (the ids went to the wrong sentences)
        raise ValueError(
            f"the encoder returned {len(encoded)} token lists for {len(sentences)} "
            f"sentences; it must return one per sentence"
        )
    out, cursor = [], 0
    for sizes in sizes_per_doc:
        ids, lengths, para_sizes = [], [], []
        for size in sizes:
            kept = 0
            for sent in encoded[cursor : cursor + size]:
                if sent:  # a sentence of punctuation the tokenizer drops has no leaves
                    ids += sent
                    lengths.append(len(sent))
                    kept += 1
            cursor += size
            if kept:
                para_sizes.append(kept)
        out.append(TokenizedDocument(ids, lengths, para_sizes) if ids else None)
    return out


def tokenize_document(text: str, tokenizer) -> TokenizedDocument:
    """Split ``text`` into paragraphs and sentences and tokenize each sentence.

    Sentences (paragraphs) that get no tokens are dropped.

    Args:
        text: the document.
        tokenizer: see :func:`as_encoder`.

    Raises:
        ValueError: if the whole document has no tokens.
    """
    (doc,) = tokenize_documents([text], tokenizer)
    if doc is None:
        raise ValueError("the document has no tokens; an empty tree cannot be built")
    return doc


def hierarchy_from_lengths(doc: TokenizedDocument, depth: int = 3, x: Tensor | None = None):
    r"""The signal hierarchy of a tokenized document.

    ``depth = 3``: root → paragraphs → sentences → tokens; ``2``: root →
    sentences → tokens (the paragraph level dropped); ``1``: root → tokens.
    Every family is a 1-D grid (``Domain.GRID1D``) and ``pos[:, 0]`` is a
    node's index among its siblings. Nodes are leaves first (token ``t`` is
    node ``t``), then sentences, paragraphs and the root.

    Args:
        doc: the tokenized document.
        depth: the number of levels below the root.
        x: ``[T, F]`` leaf features; default ``doc.ids`` (``[T]`` long token ids,
            to be embedded by the model).

    Returns:
        a :class:`SignalHierarchy` with ``T + S + P + 1`` nodes at depth 3.
    """
    _check_document(doc, "doc")
    return forest_from_lengths([doc], depth, x)


def forest_from_lengths(
    docs: Sequence[TokenizedDocument], depth: int = 3, x: Tensor | None = None
) -> SignalHierarchy:
    r"""One forest of the hierarchies of many tokenized documents, built in one vectorised step.

    The fast path of batching (no per-document tree, no PyG collation): node
    ids are level by level over all documents — every document's tokens (in
    document order), then all sentences, all paragraphs, and the ``B`` roots.
    Each tree equals :func:`hierarchy_from_lengths` of its document, and the
    leaf order is the documents' tokens concatenated, so the forest is
    interchangeable with ``Batch.from_data_list`` of the single trees for
    every hierarchical op (only internal nodes are numbered differently).

    Args:
        docs: ``B`` tokenized documents.
        depth: 3, 2 or 1 levels below each root.
        x: ``[sum T, F]`` leaf features; default the concatenated token ids.

    Returns:
        a :class:`SignalHierarchy` whose ``batch`` (``[N]``, derived) is the document of
        every node.
    """
    check_int(depth, "depth")  # (2.0 failed in a slice, True was 1)
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {DEPTHS}, got {depth!r}")
    docs = list(docs)  # (a generator was read twice: the second pass found no documents)
    if not docs:
        raise ValueError("docs is empty: a forest needs at least one document")
    for i, doc in enumerate(docs):
        _check_document(doc, f"docs[{i}]")
    per_doc = torch.tensor(
        [[d.num_tokens, d.sentence_lengths.numel(), d.paragraph_sizes.numel()] for d in docs]
    )
    # group sizes per level, bottom-up; the top level is grouped by document
    groups = [
        torch.cat([d.sentence_lengths for d in docs]),
        torch.cat([d.paragraph_sizes for d in docs]),
    ][: depth - 1] + [per_doc[:, depth - 1]]
    counts = [int(per_doc[:, level].sum()) for level in range(depth)] + [len(docs)]
    parents, slots, offset = [], [], 0
    for level, sizes in enumerate(groups):
        group = _group_ids(sizes, counts[level])
        parents.append(offset + counts[level] + group)
        slots.append(ramp(sizes))
        offset += counts[level]
    num_nodes = offset + len(docs)
    roots = torch.arange(offset, num_nodes)
    parent = torch.cat([*parents, roots])
    slot = torch.cat([*slots, torch.zeros(len(docs), dtype=torch.long)])
    level_depth = torch.arange(depth, -1, -1)
    depths = level_depth.repeat_interleave(torch.tensor(counts), output_size=num_nodes)
    return SignalHierarchy._assemble_grid1d(
        parent=parent,
        depth=depths,
        slot=slot,
        num_leaves=counts[0],
        x=torch.cat([d.ids for d in docs]) if x is None else x,
    )


def _check_document(doc, name: str) -> None:
    """Raise a ``TypeError`` unless ``doc`` is a :class:`TokenizedDocument` (an
    ``AttributeError`` inside the builder before), saying where a ``None`` comes from."""
    if not isinstance(doc, TokenizedDocument):
        hint = (
            ": tokenize_documents gives None for a document without tokens; leave those out"
            if doc is None
            else ""
        )
        raise TypeError(f"{name} must be a TokenizedDocument, got {type(doc).__name__}{hint}")


def document_hierarchy(
    text: str,
    tokenizer,
    depth: int = 3,
    max_paragraphs: int | None = None,
    max_sentences: int | None = None,
    max_sentence_tokens: int | None = None,
    max_tokens: int | None = None,
) -> SignalHierarchy:
    """Document text → signal hierarchy, with the truncation report attached.

    Example::

        tok = SimpleTokenizer.fit(corpus)
        h = document_hierarchy("One. Two words!\\n\\nNext paragraph.", tok, max_tokens=512)
        h.x            # [T] token ids (leaves, reading order)
        h.truncation   # [1, 4]: dropped paragraphs, sentences, tokens; raw tokens

    Args:
        text: the document.
        tokenizer: see :func:`as_encoder`.
        depth: 3 (paragraphs → sentences → tokens), 2 (sentences → tokens) or 1 (tokens).
        max_paragraphs, max_sentences, max_sentence_tokens, max_tokens: caps per
            level (see :meth:`TokenizedDocument.truncate`).
    """
    doc, report = tokenize_document(text, tokenizer).truncate(
        max_paragraphs, max_sentences, max_sentence_tokens, max_tokens
    )
    h = hierarchy_from_lengths(doc, depth)
    h.truncation = report.as_tensor()
    return h
