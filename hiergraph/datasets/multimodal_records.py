r"""Base class for image + text classification sets whose items are multimodal signal hierarchies.

Processing (once, cached under ``<root>/processed``) reads the raw files,
decodes every image to ``image_size × image_size`` RGB (alpha composited on
white, aspect ratio kept, centred) and tokenizes every text field with the
all-MiniLM-L6-v2 WordPiece tokenizer. Only the compact form is stored:
``image`` ``[1, 3, S, S]`` uint8, one ``[T]`` id tensor per text field
(and its raw string as ``<field>_text``), ``y``, ``source`` (the record name) and ``group``
(the split group).

On access the record becomes a :class:`~hiergraph.data.SignalHierarchy`
(:func:`~hiergraph.data.multimodal_hierarchy`): a key–value root over the
image (a 2-D grid of ``patch_size²`` patch leaves, pixels in ``[0, 1]``,
optionally grouped ``group_size × group_size``) and one 1-D grid of token
leaves per text field, carrying the frozen MiniLM static token vectors
(384-d; :mod:`hiergraph.datasets.static_embeddings`). ``fields`` selects the
modalities that go into the tree (e.g. ``('image',)`` for an image-only
model); the key ids stay those of the full schema. A text-only tree of a
record without any text gets one ``[PAD]`` token leaf in its first text
field (the model sees "no text" rather than the record being dropped).

Raw files are never downloaded; a missing dataset raises
:class:`FileNotFoundError` saying where the files are expected and how to get them
(:func:`~hiergraph.datasets.locate.locate_raw`). Building the cache holds a lock on
``<root>/processed/.lock``, so concurrent first runs build it once, and every cache file
is written to a temporary file and renamed into place, so an interrupted build leaves no
partial file. Every raw file read must lie inside the raw folder once symlinks are
resolved (:func:`resolve_inside`): a record whose path is absolute elsewhere, climbs out
with ``..`` or leads out through a symlink raises :class:`ValueError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from hiergraph._checks import as_int, check_fractions, check_int, check_seed
from hiergraph.data.multimodal import ImageField, MultimodalSchema, SequenceField
from hiergraph.datasets.errors import CorruptFileError, regular_file
from hiergraph.datasets.locate import data_root, locate_raw, resolve_inside
from hiergraph.datasets.locks import atomic_path, file_lock
from hiergraph.datasets.processed import StrictLoad

SPLITS = ("train", "val", "test")
IMAGE = "image"
#: Width of the MiniLM static token vectors.
TOKEN_CHANNELS = 384
#: The MiniLM ``[PAD]`` id: the one leaf of a text-only tree whose record has no text.
PAD_ID = 0


@dataclass
class RawRecord:
    """One item before processing.

    Attributes:
        name: an identifier (e.g. the image path relative to the raw folder).
        image: path of the image file.
        texts: text field → string.
        label: class index.
        group: the split group key (records of one group share a split).
        resolved: ``image`` as :func:`resolve_inside` returned it, when the reader
            already checked it against the raw folder; ``None`` (the default): processing
            checks it.
    """

    name: str
    image: Path
    texts: dict[str, str]
    label: int
    group: str
    resolved: Path | None = dataclasses.field(default=None, repr=False, compare=False)


class ImageTooLarge(ValueError):
    """An image declares more pixels than allowed (a decompression-bomb guard)."""


def load_image(path: Path, size: int, max_pixels: int) -> Tensor:
    """``[3, size, size]`` uint8 RGB: alpha composited on white, fitted and centred.

    The declared size is checked from the header *before* decoding.

    Raises:
        ImageTooLarge: if width × height exceeds ``max_pixels``, or Pillow's own
            decompression-bomb guard fires (its warning is turned into this error).
    """
    from PIL import Image

    regular_file(path, "an image")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            im = Image.open(path)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
            raise ImageTooLarge(f"{path}: {err}") from err
        with im:
            w, h = im.size
            if w * h > max_pixels:
                raise ImageTooLarge(
                    f"{path} declares {w}x{h} = {w * h / 1e6:.1f} Mpx > max_pixels={max_pixels}"
                )
            im.draft("RGB", (size, size))  # JPEG: decode at reduced scale; no-op for PNG
            rgba = im.convert("RGBA")
    rgba.thumbnail((size, size), Image.Resampling.BILINEAR, reducing_gap=2.0)
    canvas = Image.new("RGBA", (size, size), (255, 255, 255, 255))
    canvas.alpha_composite(rgba, ((size - rgba.width) // 2, (size - rgba.height) // 2))
    pixels = torch.frombuffer(bytearray(canvas.convert("RGB").tobytes()), dtype=torch.uint8)
    return pixels.view(size, size, 3).permute(2, 0, 1).contiguous()


@functools.lru_cache(maxsize=1)
def _token_table() -> Tensor:
    from hiergraph.datasets.static_embeddings import minilm_word_embeddings

    return minilm_word_embeddings()


class MultimodalRecordDataset(StrictLoad, InMemoryDataset):
    r"""One split of an image + text classification set, as multimodal signal hierarchies.

    Subclasses set ``name``, ``text_fields``, ``raw_env`` (the environment
    variable naming the raw folder), ``default_raw_dir``, ``how_to_get``,
    ``expected`` (what the raw folder holds, e.g. ``"png/ and svg/"``, for error
    messages) and implement :meth:`read_records` and :meth:`split_records`.

    Args:
        root: cache folder (default ``$HIERGRAPH_DATA/<name>`` or ``~/.cache/hiergraph/<name>``).
        split: ``'train'``, ``'val'`` or ``'test'``.
        raw_dir: the raw folder (default ``$<raw_env>``, else ``default_raw_dir``, else
            ``root/raw``).
        image_size: side ``S`` of the stored images (a multiple of ``patch_size``).
        patch_size: patch side ``p`` of the image grid.
        group_size: optional ``g``: a 2-level patch grid (``g × g`` patches per group).
        fields: the fields in each tree (default: the image and every text field).
        max_tokens: tokens kept per text field (the head).
        max_pixels: images declaring more pixels are skipped (decompression bombs).
        transform, force_reload: as in PyG.
    """

    name: str = ""
    text_fields: tuple[str, ...] = ()
    cache_keys = ("image", "y")
    raw_env: str = ""
    default_raw_dir: str | None = None
    how_to_get: str = ""
    expected: str = "the raw files"

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        split: str = "train",
        raw_dir: str | os.PathLike | None = None,
        image_size: int = 32,
        patch_size: int = 8,
        group_size: int | None = None,
        fields: Sequence[str] | None = None,
        max_tokens: int = 32,
        max_pixels: int = 20_000_000,
        transform: Callable | None = None,
        force_reload: bool = False,
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for name, value in (("image_size", image_size), ("patch_size", patch_size),
                            ("max_tokens", max_tokens), ("max_pixels", max_pixels)):  # fmt: skip
            check_int(value, name)  # (patch_size=0 divided by zero; floats failed later)
        if image_size % patch_size:
            raise ValueError(
                f"image_size={image_size} must be a positive multiple of patch_size={patch_size}"
            )
        self.schema = MultimodalSchema(
            [ImageField(IMAGE, 3, patch_size, group_size)]
            + [SequenceField(f, TOKEN_CHANNELS) for f in self.text_fields],
            node_types=[0] + [1] * len(self.text_fields),  # one projection for all text
        )
        self.fields = tuple(fields) if fields is not None else tuple(self.schema.keys)
        unknown = [f for f in self.fields if f not in self.schema.keys]
        if unknown or not self.fields:
            raise ValueError(
                f"fields must be a non-empty subset of {list(self.schema.keys)}, got {fields!r}"
            )
        self.split, self.image_size, self.max_tokens = split, image_size, max_tokens
        self.max_pixels = max_pixels
        root = Path(root).expanduser() if root is not None else data_root() / self.name
        self.raw_source = Path(  # ("~" expanded: a literal "~" folder was made)
            raw_dir or os.environ.get(self.raw_env) or self.default_raw_dir or root / "raw"
        ).expanduser()
        with file_lock(root / "processed"):  # one process builds the cache
            super().__init__(str(root), transform, force_reload=force_reload)
        self.load(self.processed_paths[SPLITS.index(split)])
        self.meta = self.load_meta(self.processed_paths[-1], ("classes", "splits"))
        self.classes = tuple(self.meta["classes"])
        self.check_labels(self.processed_paths[SPLITS.index(split)], len(self.classes))

    # ------------------------------------------------------------ PyG hooks
    @property
    def cache_key(self) -> str:
        """Part of the processed file names that depends on the constructor arguments."""
        return f"s{self.image_size}_t{self.max_tokens}_p{self.max_pixels}"

    @property
    def raw_file_names(self) -> list[str]:
        return []  # the raw folder is located in download()/process()

    @property
    def processed_file_names(self) -> list[str]:
        return [f"{s}_{self.cache_key}.pt" for s in SPLITS] + [f"meta_{self.cache_key}.json"]

    def download(self) -> None:
        """Never downloads: checks that the raw folder exists when the cache must be built."""
        if not all(Path(p).exists() for p in self.processed_paths):
            self.check_raw()

    def check_raw(self) -> Path:
        """The raw folder; raises :class:`FileNotFoundError` saying where to get it."""

        def complete(place: Path) -> Path | None:
            return place if place.is_dir() and self.is_raw_complete(place) else None

        return locate_raw(
            self.name,
            [self.raw_source],
            complete,
            f"a folder holding {self.expected}",
            how_to_get=self.how_to_get,
            noun=self.expected,
            raw_env=self.raw_env or None,
        )

    def process(self) -> None:
        # the completion mark goes first: a rebuild cut short leaves no cache that mixes
        # new splits with old ones
        Path(self.processed_paths[-1]).unlink(missing_ok=True)
        from hiergraph.datasets.static_embeddings import minilm_tokenizer

        raw = self.check_raw()
        records, classes, meta = self.read_records(raw)
        for r in records:
            _check_record(r, raw)
        wrong = [r for r in records if not 0 <= r.label < len(classes)]
        if wrong:
            raise ValueError(
                f"{raw}: record {wrong[0].name!r} has label {wrong[0].label}, not one of the "
                f"{len(classes)} classes' 0 .. {len(classes) - 1}"
            )
        # every image must lie inside the raw folder: checked here unless read_records did
        records = [
            dataclasses.replace(
                r,
                image=r.resolved or resolve_inside(raw, r.image, f"record {r.name!r}"),
            )
            for r in records
        ]
        parts = self.split_records(records)
        encode = minilm_tokenizer().encode_batch
        meta = {"classes": list(classes), **meta, "splits": {}, "skipped_images": []}
        for split, path in zip(SPLITS, self.processed_paths[:3], strict=True):
            chosen = [records[i] for i in parts[split]]
            data_list = []
            ids = {
                f: encode([r.texts.get(f, "") for r in chosen], add_special_tokens=False)
                for f in self.text_fields
            }
            for i, r in enumerate(chosen):
                try:
                    image = load_image(r.image, self.image_size, self.max_pixels)
                except ImageTooLarge as err:
                    meta["skipped_images"].append(str(err))
                    continue
                except OSError as err:  # truncated or not an image (Pillow's errors)
                    raise CorruptFileError(
                        r.image,
                        f"{r.image} (record {r.name!r}): cannot read this image "
                        f"({type(err).__name__}: {err}); replace or remove it",
                    ) from err
                data = Data(image=image.unsqueeze(0), y=torch.tensor([r.label]), source=r.name)
                for f in self.text_fields:
                    data[f] = torch.tensor(ids[f][i].ids[: self.max_tokens], dtype=torch.long)
                    data[f"{f}_text"] = r.texts.get(f, "")
                data.group = r.group
                data_list.append(data)
            if not data_list:
                raise ValueError(
                    f"{raw}: the {split!r} split is empty; the collection is too small "
                    "(or has too few groups) for a train/val/test split"
                )
            counts = torch.bincount(torch.cat([d.y for d in data_list]), minlength=len(classes))
            meta["splits"][split] = {"size": len(data_list), "per_class": counts.tolist()}
            self.save(data_list, path)  # StrictLoad.save: atomic, never a half-written file
        with atomic_path(self.processed_paths[-1]) as tmp:  # written last: marks completion
            tmp.write_text(json.dumps(meta, indent=1))

    def get(self, idx: int):
        rec = super().get(idx)
        table = _token_table()
        texts = [f for f in self.text_fields if f in self.fields]
        record = {f: table[rec[f]] for f in texts}
        if IMAGE in self.fields:
            record[IMAGE] = rec.image[0].float() / 255.0
        elif all(rec[f].numel() == 0 for f in texts):  # no text at all: one padding token
            record[texts[0]] = table[torch.tensor([PAD_ID])]
        h = self.schema.build(record)
        h.y = rec.y
        return h

    # ------------------------------------------------------------- raw data
    def is_raw_complete(self, raw: Path) -> bool:
        """Whether ``raw`` looks like the expected raw folder."""
        return True

    def read_records(self, raw: Path) -> tuple[list[RawRecord], list[str], dict]:
        """``(records, class names, extra metadata for the meta JSON)``."""
        raise NotImplementedError

    def split_records(self, records: list[RawRecord]) -> dict[str, list[int]]:
        """Record indices per split (``'train'``, ``'val'``, ``'test'``)."""
        raise NotImplementedError

    # -------------------------------------------------------------- reports
    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def records(self) -> list[Data]:
        """The compact stored records of this split (uint8 image, token ids, ``y``, ``group``)."""
        return [super(MultimodalRecordDataset, self).get(i) for i in range(len(self))]

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({len(self)}, split={self.split!r}, "
            f"classes={self.num_classes}, fields={list(self.fields)})"
        )


def _check_record(record: RawRecord, raw: Path) -> None:
    """Raise a ``TypeError`` naming the record unless its label is an int (NumPy's too) and
    its texts a mapping of field names to strings, as read from the raw files: a label of
    ``True`` was class 1, ``0.5`` or ``"1"`` failed inside a count, and a text that is no
    string inside the tokenizer."""
    label = record.label
    if isinstance(label, bool) or not isinstance(label, Integral):
        raise TypeError(
            f"{raw}: record {record.name!r} has label {label!r}, not an int class index"
        )
    texts = record.texts
    if not isinstance(texts, Mapping) or not all(isinstance(t, str) for t in texts.values()):
        raise TypeError(
            f"{raw}: record {record.name!r} has texts {texts!r}; they must map each text "
            "field to a str (an empty one for a missing text)"
        )


def group_split(
    groups: Sequence[str],
    labels: Sequence[int],
    fractions: Sequence[float] = (0.7, 0.15, 0.15),
    seed: int = 0,
) -> list[list[int]]:
    r"""Split items so that every group lies in one part, class proportions kept where possible.

    Groups are taken largest first (ties in a seeded random order) and each
    goes to the part whose per-class quotas it overfills least, i.e. the part
    :math:`s` minimising
    :math:`\sum_c n_{gc}\,(m_{sc} + n_{gc}) / (f_s N_c)`, where
    :math:`n_{gc}` counts the group's items of class :math:`c`,
    :math:`N_c` all items of class :math:`c`, :math:`f_s` the part's fraction
    and :math:`m_{sc}` the items of class :math:`c` already in part :math:`s`.
    Groups larger than a small part's quota therefore land in the largest
    part. Deterministic for a fixed seed.

    Labels are ints (NumPy's too); any ints name the classes, which need not run from 0.

    Returns:
        one sorted list of item indices per part.
    """
    fractions = check_fractions(fractions)
    if len(groups) != len(labels):
        raise ValueError(f"{len(groups)} groups but {len(labels)} labels")
    seed = check_seed(seed)
    classes = [as_int(label, "each label") for label in labels]  # (1.5 was class 1)
    # classes numbered 0, 1, ... in label order (a negative label failed in bincount, and
    # a large one sized the per-class counts)
    _, labels_t = torch.unique(torch.tensor(classes, dtype=torch.long), return_inverse=True)
    num_classes = int(labels_t.max()) + 1 if labels_t.numel() else 0
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    names = sorted(members)
    gen = torch.Generator().manual_seed(seed)
    tiebreak = torch.randperm(len(names), generator=gen).tolist()
    order = sorted(range(len(names)), key=lambda j: (-len(members[names[j]]), tiebreak[j]))
    frac = torch.tensor(list(fractions), dtype=torch.float64)
    quota = frac[:, None] * torch.bincount(labels_t, minlength=num_classes).double()[None]
    filled = torch.zeros_like(quota)
    parts: list[list[int]] = [[] for _ in fractions]
    for j in order:
        idx = members[names[j]]
        n = torch.bincount(labels_t[idx], minlength=num_classes).double()
        overfill = (n * (filled + n) / quota.clamp(min=1e-9)).sum(1)
        best = int(torch.argmin(overfill))
        parts[best].extend(idx)
        filled[best] += n
    return [sorted(p) for p in parts]
