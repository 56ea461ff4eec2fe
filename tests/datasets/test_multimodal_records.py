"""MultimodalRecordDataset: raw files are read from inside the raw folder only."""

from pathlib import Path

import pytest

from hiergraph.datasets.multimodal_records import (
    MultimodalRecordDataset,
    RawRecord,
    resolve_inside,
)


def test_resolve_inside(tmp_path):
    root = tmp_path / "raw"
    (root / "img").mkdir(parents=True)
    (root / "img" / "a.png").write_bytes(b"a")
    (tmp_path / "secret").write_bytes(b"s")
    assert resolve_inside(root, root / "img" / "a.png", "a") == (root / "img" / "a.png").resolve()
    assert resolve_inside(root, root / "img" / ".." / "img" / "a.png", "a").name == "a.png"
    (root / "img" / "in.png").symlink_to(root / "img" / "a.png")
    assert resolve_inside(root, root / "img" / "in.png", "in").name == "a.png"
    link = tmp_path / "link"
    link.symlink_to(root, True)
    assert resolve_inside(link, link / "img" / "a.png", "a").name == "a.png"

    (root / "img" / "out.png").symlink_to(tmp_path / "secret")
    cases = {
        "entry 'abs'": root / "img" / str(tmp_path / "secret"),  # an absolute name
        "entry 'dots'": root / "img" / ".." / ".." / "secret",
        "entry 'link'": root / "img" / "out.png",
        "entry 'prefix'": tmp_path / "raw_other" / "x.png",  # shares the root's name prefix
    }
    for entry, path in cases.items():
        with pytest.raises(ValueError, match="outside the raw folder") as info:
            resolve_inside(root, path, entry)
        assert str(info.value).startswith(f"{entry}: ") and repr(str(root)) in str(info.value)


class _OneRecord(MultimodalRecordDataset):
    name = "OneRecord"
    text_fields = ("title",)
    raw_env = "HIERGRAPH_TEST_ONE_RECORD"
    image: Path

    def read_records(self, raw: Path):
        record = RawRecord(name="x", image=self.image, texts={"title": "x"}, label=0, group="x")
        return [record], ["only"], {}

    def split_records(self, records):
        return {"train": [0], "val": [0], "test": [0]}


def test_process_refuses_images_outside_the_raw_folder(tmp_path, monkeypatch):
    from PIL import Image

    raw = tmp_path / "raw"
    raw.mkdir()
    Image.new("RGB", (8, 8), "red").save(tmp_path / "secret.png")
    monkeypatch.setattr(_OneRecord, "image", raw / ".." / "secret.png", raising=False)
    with pytest.raises(ValueError, match="record 'x'.* outside the raw folder"):
        _OneRecord(tmp_path / "cache", raw_dir=raw)
