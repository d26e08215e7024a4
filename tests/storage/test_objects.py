"""The folder-as-bucket view both HTTP stores answer from: ranges, keys, listings and pages."""

import pytest

from stallscope.storage.emulator.folder_bucket import ByteRangeError, FolderBucket, parse_range


def test_parse_range_forms():
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-9", 100) == (0, 9)
    assert parse_range("bytes=90-", 100) == (90, 99)
    assert parse_range("bytes=-10", 100) == (90, 99)
    assert parse_range("bytes=50-1000", 100) == (50, 99)  # clipped to the object
    assert parse_range("bytes=0-1,5-6", 100) is None  # multi-range: the whole object
    with pytest.raises(ByteRangeError):
        parse_range("bytes=100-", 100)


@pytest.fixture
def bucket(tmp_path):
    root = tmp_path / "root"
    for key in ("a/x.txt", "a/b/y.bin", "a/b/z.bin", "c.txt", "d/e/f/g.txt"):
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(key.encode())
    (root / "empty" / "deeper").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("outside")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    return FolderBucket(root, "data")


def test_keys_leaving_the_folder_are_not_objects(bucket):
    assert bucket.stat("a/x.txt").size == len(b"a/x.txt")
    for key in ("../secret.txt", "a/../../secret.txt", "/etc/passwd", "link.txt", "a", "a/", "empty"):
        assert bucket.stat(key) is None, key


def test_listing_recursive_with_prefix_and_pages(bucket):
    everything = bucket.list()
    assert [o.key for o in everything.objects] == ["a/b/y.bin", "a/b/z.bin", "a/x.txt", "c.txt", "d/e/f/g.txt"]
    assert [o.key for o in bucket.list("a/b").objects] == ["a/b/y.bin", "a/b/z.bin"]
    keys, token = [], ""
    while True:
        page = bucket.list("", "", token, page_size=2)
        keys += [o.key for o in page.objects]
        token = page.next_token
        if not token:
            break
    assert keys == [o.key for o in everything.objects]


def test_listing_with_delimiter_folds_folders_and_skips_empty_ones(bucket):
    top = bucket.list("", "/")
    assert [o.key for o in top.objects] == ["c.txt"]
    assert top.prefixes == ("a/", "d/")  # 'empty/' holds no file, so it does not exist
    inner = bucket.list("a/", "/")
    assert [o.key for o in inner.objects] == ["a/x.txt"] and inner.prefixes == ("a/b/",)
    assert bucket.list("nothing/", "/").objects == ()
