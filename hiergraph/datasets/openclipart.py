r"""Open Clip Art Library 0.18 (public domain) as an image + text classification set.

The Debian packages ``openclipart-png`` and ``openclipart-svg`` install
8,121 clip-art images as ``/usr/share/openclipart/{png,svg}/<category
path>/<name>.{png,svg}``; each SVG's ``<metadata>`` holds the Dublin Core
``dc:title``, ``dc:description`` and ``dc:subject`` keywords. The label is the
top-level category folder.

Cleaning, in order (counts are in ``dataset.meta``):

1. metadata is read from the SVG's ``<cc:Work>`` block by a plain scan for
   the tags (no XML parser: no entity expansion, so no XML bombs; the scan
   is linear in the file size, so crafted metadata cannot stall it);
2. images are identified by the MD5 of their PNG: an image filed under two or
   more *top-level* categories is ambiguous and dropped (every copy); copies
   within one category are kept once (the first path);
3. PNGs declaring more than ``max_pixels`` (20 Mpx) are skipped before
   decoding (17 of them; some trip Pillow's decompression-bomb guard);
4. ``unsorted`` and ``special`` are dropped and categories with fewer than
   ``min_count`` (40) remaining images are dropped. This leaves **13 classes**
   and 6,026 records (:data:`CLASSES`; 8,121 files → 6,900 unique images →
   481 multi-category images, 649 copies, 17 oversized PNGs and 376 images of
   small or excluded classes dropped).

**Title-group split.** Titles are often collection names ("gramastar" on
1,375 files), so a random split would put near-identical titles on both
sides. Records are grouped by their title lower-cased with everything but
letters removed ("Part of the Flat Icon Collection (Wed Aug 25 23:29:46
2004)" and "… 23:23:49 …" are one group; an empty title is a group of its
own), and whole groups go to train/val/test (70/15/15 of the records, class
proportions balanced greedily; :func:`~hiergraph.datasets.multimodal_records.group_split`,
seed 0). No title group is shared between splits.

Text fields: ``title`` and ``description``. Keywords are off by default
because they name the category (``keywords=True`` adds a ``keywords`` field
with every category name removed from it).
"""

from __future__ import annotations

import hashlib
import html
import re
from collections import Counter
from pathlib import Path

from hiergraph.datasets.errors import CorruptFileError, regular_file
from hiergraph.datasets.locate import resolve_inside
from hiergraph.datasets.multimodal_records import MultimodalRecordDataset, RawRecord, group_split

OPENCLIPART_ENV = "HIERGRAPH_OPENCLIPART"
#: The classes of the default settings (``min_count=40``), in label order.
CLASSES = (
    "animals",
    "buildings",
    "computer",
    "food",
    "geography",
    "office",
    "people",
    "plants",
    "recreation",
    "shapes",
    "signs_and_symbols",
    "tools",
    "transportation",
)
#: Every top-level category folder of the collection.
CATEGORIES = CLASSES + (
    "buttons",
    "containers",
    "decorations",
    "education",
    "electronics",
    "logos",
    "science",
    "special",
    "unsorted",
)
DROPPED_CATEGORIES = ("unsorted", "special")

# Every search below is linear in the input: an opening tag is found by a
# literal (or a literal and a word boundary), and its closing tag by one
# bytes.find; no pattern scans ahead from every candidate start, which made
# the former lazy ``<tag>[\s\S]*?</tag>`` regexes quadratic on unclosed tags.
_WORK_OPEN = re.compile(rb"<cc:Work\b")
_WORK_CLOSE = b"</cc:Work>"
_AGENT_OPEN = re.compile(rb"<dc:(publisher|creator|rights|contributor)\b")
_TAGS = (b"title", b"description")
_NOT_LETTERS = re.compile(r"[^a-z]+")


def _element(data: bytes, name: bytes) -> bytes | None:
    """The content of the first ``<name>…</name>`` in ``data`` (``None`` if there is none).

    The first opening tag decides: a closing tag after any later opening tag
    also lies after the first one.
    """
    opening = b"<" + name + b">"
    start = data.find(opening)
    if start < 0:
        return None
    start += len(opening)
    end = data.find(b"</" + name + b">", start)
    return data[start:end] if end >= 0 else None


def _elements(data: bytes, name: bytes) -> list[bytes]:
    """The contents of the successive, non-overlapping ``<name>…</name>`` in ``data``."""
    opening, closing = b"<" + name + b">", b"</" + name + b">"
    out, pos = [], 0
    while (start := data.find(opening, pos)) >= 0:
        start += len(opening)
        end = data.find(closing, start)
        if end < 0:  # no later opening tag has a closing one either
            break
        out.append(data[start:end])
        pos = end + len(closing)
    return out


def _without_agents(work: bytes) -> bytes:
    """``work`` without its ``<dc:publisher|creator|rights|contributor …>…</dc:…>`` elements.

    Each element runs from its opening tag to the first matching closing tag;
    an opening tag without one is kept. Per agent name, the position of its
    next closing tag is remembered, so every byte is searched once.
    """
    pieces, pos = [], 0
    next_close: dict[bytes, int] = {}  # name -> position of a closing tag found earlier, or -1
    for match in _AGENT_OPEN.finditer(work):
        if match.start() < pos:  # inside an element already removed
            continue
        name = match.group(1)
        closing = b"</dc:" + name + b">"
        end = next_close.get(name)
        if end is None or 0 <= end < match.end():
            end = next_close[name] = work.find(closing, match.end())
        if end < 0:
            continue
        pieces.append(work[pos : match.start()])
        pos = end + len(closing)
    pieces.append(work[pos:])
    return b"".join(pieces)


def svg_metadata(svg: bytes) -> dict[str, str | list[str]]:
    """``{'title', 'description', 'keywords'}`` of the ``<cc:Work>`` block of an SVG.

    Agents (publisher, creator, rights, contributor) have titles of their own;
    they are removed first so that ``title`` is the work's. Missing tags give
    ``''``/``[]``. Runs in time linear in ``len(svg)``, whatever the input.
    """
    work = b""
    opening = _WORK_OPEN.search(svg)
    if opening is not None:
        end = svg.find(_WORK_CLOSE, opening.end())
        if end >= 0:
            work = _without_agents(svg[opening.start() : end + len(_WORK_CLOSE)])

    def text(raw: bytes) -> str:
        return html.unescape(raw.decode("utf-8", "replace")).strip()

    out: dict[str, str | list[str]] = {}
    for name in _TAGS:
        found = _element(work, b"dc:" + name)
        out[name.decode()] = text(found) if found is not None else ""
    subject = _element(work, b"dc:subject")
    out["keywords"] = (
        [text(k) for k in _elements(subject, b"rdf:li")] if subject is not None else []
    )
    return out


def title_group(title: str, name: str) -> str:
    """The split group of a record: its title lower-cased, letters only; ``name`` if empty."""
    key = " ".join(_NOT_LETTERS.split(title.lower())).strip()
    return key or f"<untitled> {name}"


def png_size(path: Path) -> tuple[int, int]:
    """The declared ``(width, height)`` of a PNG, from its header only."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise CorruptFileError(
            path, f"{path} is not a PNG file (no PNG header); replace or remove it"
        )
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def scan_openclipart(raw: Path, max_pixels: int = 20_000_000, min_count: int = 40):
    """Read and clean the whole collection (no image decoding).

    Returns ``(records, classes, report)``: one :class:`RawRecord` per kept
    image (texts ``title``, ``description``, ``keywords`` joined by spaces),
    the class names, and counts of what was dropped at each step.

    Every file read must lie inside ``raw`` once symlinks are resolved
    (symlinks between files of the collection are fine): a PNG or SVG that is,
    or lies under, a symlink pointing out of ``raw`` raises :class:`ValueError`
    naming the file and ``raw`` (the collection is refused rather than the file
    skipped).
    """
    by_digest: dict[str, list[Path]] = {}
    resolved: dict[Path, Path] = {}  # checked once, here (processing takes these paths)
    for png in sorted((raw / "png").rglob("*.png")):
        resolved[png] = resolve_inside(raw, png, f"PNG {png.relative_to(raw).as_posix()!r}")
        digest = hashlib.md5(_read(resolved[png], f"PNG {png.name!r}")).hexdigest()
        by_digest.setdefault(digest, []).append(png)
    report = Counter(files=sum(len(v) for v in by_digest.values()), unique_images=len(by_digest))
    kept: list[tuple[str, Path]] = []
    for paths in by_digest.values():
        categories = {p.relative_to(raw / "png").parts[0] for p in paths}
        if len(categories) > 1:
            report["dropped_multi_category"] += 1
            continue
        report["dropped_copies_within_category"] += len(paths) - 1
        png = paths[0]
        width, height = png_size(png)
        if width * height > max_pixels:
            report["dropped_too_large"] += 1
            continue
        kept.append((categories.pop(), png))
    counts = Counter(c for c, _ in kept)
    classes = sorted(c for c, n in counts.items() if n >= min_count and c not in DROPPED_CATEGORIES)
    report["dropped_small_or_excluded_classes"] = sum(
        n for c, n in counts.items() if c not in classes
    )
    records = []
    for category, png in sorted(kept, key=lambda item: item[1]):
        if category not in classes:
            continue
        rel = png.relative_to(raw / "png").as_posix()[: -len(".png")]
        svg = resolve_inside(raw, raw / "svg" / f"{rel}.svg", f"SVG of {rel!r}")
        meta = svg_metadata(_read(svg, f"the SVG of {rel!r}"))
        keywords = [k for k in meta["keywords"] if k.lower() not in _CATEGORY_WORDS]
        records.append(
            RawRecord(
                name=rel,
                image=png,
                texts={
                    "title": meta["title"],
                    "description": meta["description"],
                    "keywords": " ".join(keywords),
                },
                label=classes.index(category),
                group=title_group(meta["title"], rel),
                resolved=resolved[png],
            )
        )
    report["records"] = len(records)
    return records, classes, dict(report)


#: Category words removed from keywords: every folder name, and its parts.
_CATEGORY_WORDS = frozenset(CATEGORIES) | {"signs", "symbols", "signs and symbols"}


class OpenClipArt(MultimodalRecordDataset):
    r"""Open Clip Art 0.18: 13 classes of clip art, image + title + description.

    Sizes with the defaults (title-group split, seed 0; ``dataset.meta``
    has the per-class counts): see the module docstring for the cleaning
    steps.

    Raw folder: ``raw_dir=``, else ``$HIERGRAPH_OPENCLIPART``, else
    ``/usr/share/openclipart`` (where ``apt-get install openclipart-png
    openclipart-svg`` puts it); it must hold ``png/`` and ``svg/``. Files
    reached through symlinks pointing out of it are refused
    (:func:`scan_openclipart`).

    Args:
        keywords: add the ``dc:subject`` keywords (category names removed) as a
            third text field. Off by default: keywords leak the label.
        min_count: smallest class size kept.
        seed: seed of the title-group split.
        **kwargs: see :class:`~hiergraph.datasets.multimodal_records.MultimodalRecordDataset`.
    """

    name = "OpenClipArt"
    raw_env = OPENCLIPART_ENV
    default_raw_dir = "/usr/share/openclipart"
    how_to_get = (
        "Get it with `apt-get install openclipart-png openclipart-svg`, or without root "
        "`apt-get download openclipart-png openclipart-svg && dpkg -x <deb> <dir>` "
        "(then use <dir>/usr/share/openclipart); `.ci/fetch_multimodal_data.sh <cache>` does this."
    )
    expected = "png/ and svg/"

    def __init__(self, *args, keywords: bool = False, min_count: int = 40, seed: int = 0, **kwargs):
        self.keywords, self.min_count, self.seed = keywords, min_count, seed
        self.text_fields = ("title", "description") + (("keywords",) if keywords else ())
        super().__init__(*args, **kwargs)

    @property
    def cache_key(self) -> str:
        kw = "_kw" if self.keywords else ""
        return f"{super().cache_key}_m{self.min_count}_seed{self.seed}{kw}"

    def is_raw_complete(self, raw: Path) -> bool:
        return (raw / "png").is_dir() and (raw / "svg").is_dir()

    def read_records(self, raw: Path):
        return scan_openclipart(raw, self.max_pixels, self.min_count)

    def split_records(self, records: list[RawRecord]) -> dict[str, list[int]]:
        parts = group_split([r.group for r in records], [r.label for r in records], seed=self.seed)
        return dict(zip(("train", "val", "test"), parts, strict=True))


def _read(path: Path, what: str) -> bytes:
    """The bytes of a file of the collection, or a :class:`CorruptFileError` naming it and
    ``what`` it is (a missing SVG, a folder where a file should be)."""
    try:
        return regular_file(path, what).read_bytes()
    except (FileNotFoundError, PermissionError, CorruptFileError) as err:
        problem = "not a regular file" if isinstance(err, CorruptFileError) else type(err).__name__
        raise CorruptFileError(
            path,
            f"{path}: cannot read {what} ({problem}); every PNG of the collection "
            "needs its SVG under svg/ with the same relative name. Put the official package "
            "in its place.",
        ) from err
