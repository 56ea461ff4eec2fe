"""IMDB Large Movie Review dataset (Maas et al., ACL 2011) as document hierarchies."""

from __future__ import annotations

import re
from pathlib import Path

from hiergraph.datasets.archives import FirstCopies, decode
from hiergraph.datasets.text import TextClassificationDataset, official_splits

_REVIEW = re.compile(r"^(?:aclImdb/)?(train|val|test)/(pos|neg)/(\d+)_(\d+)\.txt$")


class IMDB(TextClassificationDataset):
    r"""IMDB sentiment (2 classes: ``neg`` = 0, ``pos`` = 1), one hierarchy per review.

    Splits: ``test`` is the official test set (25,000 reviews); the official
    training set (25,000) is cut into ``train`` (90%) and ``val`` (10%) by a
    fixed seeded stratified split over reviews sorted by (label, file id), so
    the split is the same whichever layout the files come in.

    Paragraphs are separated by ``<br /><br />``. Accepted raw sources (in
    ``root/raw``, ``raw_dir=`` or ``$HIERGRAPH_RAW``), tarballs read without
    extracting:

    * the official ``aclImdb_v1.tar.gz`` or its extracted ``aclImdb/`` folder
      (``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt``; ``unsup/`` and the
      other files are never read);
    * a repacked ``aclImdb_50k.tar.gz`` without the top-level folder, where part of
      the official training set sits in ``val/``, or a folder with that content
      (``train/`` and ``val/`` are merged and split again, as above).

    When none is found, the official archive is downloaded into ``root/raw`` and
    checked against ``REMOTE_FILES["IMDB"]`` (:mod:`hiergraph.datasets.download`).
    """

    name = "IMDB"
    sources = ("aclImdb_v1.tar.gz", "aclImdb_50k.tar.gz", "aclImdb")
    classes = ("neg", "pos")
    how_to_get = (
        "The official archive is https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz."
    )
    expected = "IMDB reviews in [aclImdb/]<train|val|test>/<pos|neg>/<id>_<rating>.txt"

    def read_raw(self, source: Path) -> dict[str, list[tuple[str, int]]]:
        train, test, copies = [], [], FirstCopies(source)
        for path, content in self.raw_files(source, lambda name: bool(_REVIEW.match(name))):
            match = _REVIEW.match(path)
            split, label, file_id = match[1], self.classes.index(match[2]), int(match[3])
            part, text = ("test" if split == "test" else "train"), decode(content)
            what = f"{part} review {match[2]}/{file_id}"  # (train/ and val/ are one part)
            if copies.first((part, label, file_id), path, text, what):
                (test if part == "test" else train).append((label, file_id, text))
        if not train or not test:
            raise FileNotFoundError(
                f"{source} has no IMDB reviews in <train|val|test>/<pos|neg>/<id>_<rating>.txt "
                f"(train: {len(train)}, test: {len(test)}); is it the right archive?"
            )
        return official_splits(train, test)
