"""20 Newsgroups, "bydate" version, as document hierarchies."""

from __future__ import annotations

import re
from pathlib import Path

from hiergraph.datasets.archives import FirstCopies, decode
from hiergraph.datasets.text import TextClassificationDataset, official_splits

_POST = re.compile(r"^(?:[^/]+/)?20news-bydate-(train|test)/([a-z.-]+)/(\d+)$")

NEWSGROUPS = (
    "alt.atheism",
    "comp.graphics",
    "comp.os.ms-windows.misc",
    "comp.sys.ibm.pc.hardware",
    "comp.sys.mac.hardware",
    "comp.windows.x",
    "misc.forsale",
    "rec.autos",
    "rec.motorcycles",
    "rec.sport.baseball",
    "rec.sport.hockey",
    "sci.crypt",
    "sci.electronics",
    "sci.med",
    "sci.space",
    "soc.religion.christian",
    "talk.politics.guns",
    "talk.politics.mideast",
    "talk.politics.misc",
    "talk.religion.misc",
)


def strip_headers(post: str) -> str:
    """The body of a Usenet post, with its ``Subject:`` text as the first paragraph.

    The header block (up to the first blank line) is removed: sender,
    organisation and the like identify the group without reading the text.
    """
    head, sep, body = post.partition("\n\n")
    if not sep:
        return post
    subject = re.search(r"^Subject:[ \t]*(.*)$", head, re.MULTILINE)
    return f"{subject[1].strip()}\n\n{body}" if subject else body


class TwentyNewsgroups(TextClassificationDataset):
    r"""20 Newsgroups "bydate" (20 classes, alphabetical), one hierarchy per post.

    Splits: ``test`` is the bydate test set (7,532 posts); the bydate training
    set (11,314) is cut into ``train`` (90%) and ``val`` (10%) by a fixed
    seeded stratified split over posts sorted by (group, id). Headers are
    removed except the subject (:func:`strip_headers`); quotes and signatures
    are kept.

    Raw source (in ``root/raw``, ``raw_dir=`` or ``$HIERGRAPH_RAW``):
    ``20news-bydate.tar.gz`` or ``20news_bydate.tar.gz`` (layout
    ``20news-bydate-{train,test}/<group>/<id>``), or the extracted folders in
    a folder ``20news-bydate``. When none is found, the official archive is
    downloaded into ``root/raw`` and checked against ``REMOTE_FILES["20NG"]``
    (:mod:`hiergraph.datasets.download`).
    """

    name = "20NG"
    sources = ("20news_bydate.tar.gz", "20news-bydate.tar.gz", "20news-bydate")
    classes = NEWSGROUPS
    how_to_get = (
        "The official archive is http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz."
    )
    expected = "20 Newsgroups posts in 20news-bydate-<train|test>/<group>/<id>"

    def read_raw(self, source: Path) -> dict[str, list[tuple[str, int]]]:
        posts: dict[str, list] = {"train": [], "test": []}

        def wanted(name: str) -> bool:
            match = _POST.match(name)
            return match is not None and match[2] in self.classes

        copies = FirstCopies(source)
        for path, content in self.raw_files(source, wanted):
            match = _POST.match(path)
            key, text = (match[1], self.classes.index(match[2]), int(match[3])), decode(content)
            if copies.first(key, path, text, f"{match[1]} post {match[2]}/{match[3]}"):
                posts[match[1]].append((*key[1:], strip_headers(text)))
        if not posts["train"] or not posts["test"]:
            raise FileNotFoundError(
                f"{source} has no posts in 20news-bydate-<train|test>/<group>/<id> "
                f"(train: {len(posts['train'])}, test: {len(posts['test'])})"
            )
        return official_splits(posts["train"], posts["test"])
