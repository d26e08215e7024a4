"""The storage layer against a real loopback S3 server: parsing, one listing, reads, writes, errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stallscope.storage import gcs_store, location, obstore_client, s3_request_plan
from stallscope.storage.location import GsPath, S3Path, StorageError, as_path

from .conftest import BUCKET


def test_a_gs_listing_through_obstore_takes_folder_objects_for_folders():
    """obstore drops a folder object's slash ("data/" -> "data", "data/a/" -> "data/a": checked against a
    real S3 listing with such keys), so the prefix's own and any name with objects below it are
    folders, as TF's listing takes them; an empty folder object stays a 0-byte name, as in TF's."""
    import datetime

    when = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)

    def meta(path, size=0):
        return {"path": path, "size": size, "last_modified": when}

    page = [meta("data"), meta("data/a"), meta("data/a/b"), meta("data/a/b/x.jpg", 7), meta("data/c.jpg", 9),
            meta("data/empty")]
    files = obstore_client.listed_objects("data", page)
    obstore_client.without_folders(files)
    assert {name: info.size for name, info in files.items()} == {"a/b/x.jpg": 7, "c.jpg": 9, "empty": 0}
    assert files["c.jpg"].mtime_ns == int(when.timestamp() * 1e9)
    whole = obstore_client.listed_objects("", [meta("a"), meta("a/x.jpg", 3)])  # a whole bucket
    obstore_client.without_folders(whole)
    assert list(whole) == ["a/x.jpg"]


def test_urls_become_remote_paths_and_local_paths_stay_paths(tmp_path):
    path = as_path("s3://bucket/some/prefix/")
    assert isinstance(path, S3Path) and str(path) == "s3://bucket/some/prefix"
    assert path.bucket == "bucket" and path.key == "some/prefix"
    child = path / "train" / "a.jpg"
    assert str(child) == "s3://bucket/some/prefix/train/a.jpg" and child.suffix == ".jpg" and child.name == "a.jpg"
    assert str(child.relative_to(path)) == "train/a.jpg" and child.parent.parent == path
    assert as_path("gs://bucket/x") != as_path("s3://bucket/x") and isinstance(as_path("gs://b/x"), GsPath)
    assert as_path(str(tmp_path)) == tmp_path and isinstance(as_path(str(tmp_path)), Path)
    with pytest.raises(location.UsageError, match="no bucket"):
        as_path("s3:///prefix")
    with pytest.raises(location.UsageError, match="hdfs://"):
        as_path("hdfs://namenode/data")


def test_one_listing_answers_every_question_about_the_tree(s3_env, monkeypatch):
    tree = s3_env["tree"]
    root = as_path(f"s3://{BUCKET}/tree")
    calls = []
    store = location.backend(root)
    original = store.list
    monkeypatch.setattr(store, "list", lambda path: calls.append(path) or original(path))
    assert root.is_dir() and not root.is_file()
    assert [p.name for p in root.iterdir()] == sorted(p.name for p in tree.iterdir())
    local_files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert [p.relative_to(root).as_posix() for p in root.walk_files()] == local_files
    first = root / local_files[0]
    assert first.is_file() and first.stat().st_size == (tree / local_files[0]).stat().st_size
    assert abs(first.stat().st_mtime_ns / 1e9 - time.time()) < 3600  # the object's upload time
    assert not (root / "no-such-folder").exists()
    assert not as_path(f"s3://{BUCKET}/no-such-prefix").exists()  # an empty prefix: not there (yet)
    assert calls == [root, as_path(f"s3://{BUCKET}/no-such-prefix")]  # the tree listed once, whatever was asked


@pytest.fixture(params=["obstore", "s3fs"])
def s3_reader(request, monkeypatch):
    """Each reader of whole s3:// objects in turn (STALLSCOPE_S3_READER)."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="obstore (the storage extra) reads s3:// objects where installed")
    monkeypatch.setenv(s3_request_plan.READER_ENV, request.param)
    return request.param


def test_reads_return_the_local_bytes_with_many_requests_in_flight(s3_env, s3_reader):
    tree = s3_env["tree"]
    root = as_path(f"s3://{BUCKET}/tree")
    files = list(root.walk_files())
    expected = [(tree / p.relative_to(root).as_posix()).read_bytes() for p in files]
    assert location.read_many(files, 8) == expected
    assert files[0].read_bytes() == expected[0]


@pytest.mark.parametrize("overrides, expected", [
    ({"AWS_SECRET_ACCESS_KEY": "wrong"}, "refused the credentials (SignatureDoesNotMatch)"),
    ({"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY"}, "refused the credentials (InvalidAccessKeyId)"),
    ({"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, "no credentials for s3://; expected AWS_ACCESS_KEY_ID"),
])
def test_refused_reads_are_one_line_naming_the_object(s3_env, s3_reader, monkeypatch, overrides, expected):
    root = as_path(f"s3://{BUCKET}/tree")
    files = sorted(root.walk_files(), key=str)[:4]  # listed with good credentials
    for name, value in overrides.items():
        monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name)
    location.set_timeout(5)  # fresh clients that read the changed environment
    with pytest.raises(StorageError) as caught:
        location.read_many(files, 4)
    message = str(caught.value)
    assert expected in message and message.startswith(str(files[0])) and "\n" not in message


def test_missing_buckets_objects_and_a_dead_store_are_one_line_for_reads(s3_env, s3_reader, monkeypatch):
    from .conftest import free_port

    here = as_path(f"s3://{BUCKET}/tree/no-such.jpg")
    with pytest.raises(StorageError, match=r"^s3://data/tree/no-such.jpg: no such object or prefix; expected one"):
        location.read_many([here], 1)
    with pytest.raises(StorageError, match=r"^s3://no-such-bucket/a.jpg: bucket 'no-such-bucket' does not exist"):
        location.read_many([as_path("s3://no-such-bucket/a.jpg")], 1)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    location.set_timeout(2)
    started = time.monotonic()
    # Nothing listens: obstore says the connection was refused, which no longer timeout would mend;
    # s3fs's error does not carry the refusal, so its line stays the timeout's.
    said = "refused the connection .*expected a running store" if s3_reader == "obstore" else \
        "did not answer .*--storage-timeout$"
    with pytest.raises(StorageError, match=f"^{here}: the store at {dead} {said}"):
        location.read_many([here], 1)
    assert time.monotonic() - started < 30


def test_obstore_reads_a_bucket_in_the_region_s3_names_when_none_is_configured(s3_env, monkeypatch):
    pytest.importorskip("obstore", reason="obstore (the storage extra) reads s3:// objects where installed")
    client = s3_env["client"]
    client.create_bucket(Bucket="far-away", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    client.put_object(Bucket="far-away", Key="a.jpg", Body=b"far")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv(s3_request_plan.READER_ENV, "obstore")
    location.set_timeout(5)
    path = as_path("s3://far-away/a.jpg")
    assert location.read_many([path], 1) == [b"far"]
    assert location.backend(path).objects().store("far-away").config["region"] == "eu-west-1"
    client.delete_object(Bucket="far-away", Key="a.jpg")
    client.delete_bucket(Bucket="far-away")


def test_a_profiles_endpoint_serves_listings_and_reads_alike(s3_env, s3_reader, monkeypatch, tmp_path):
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nendpoint_url = {s3_env['endpoint']}\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    location.set_timeout(5)
    root = as_path(f"s3://{BUCKET}/tree")
    files = sorted(root.walk_files(), key=str)[:3]  # listed through s3fs
    assert location.read_many(files, 3) == [(s3_env["tree"] / p.relative_to(root).as_posix()).read_bytes() for p in files]


@pytest.fixture
def tls_store(tiny_tree, tmp_path, monkeypatch):
    """The tiny tree as bucket BUCKET over HTTPS (the emulator's S3 server serving TLS), with
    a certificate from a CA of its own whose PEM is `ca.pem`; this process's environment points at it."""
    import ssl
    import threading

    from stallscope.storage.emulator.counters import SharedCounters
    from stallscope.storage.emulator.folder_bucket import FolderBucket
    from stallscope.storage.emulator.s3_server import S3Server

    from .conftest import s3_environment

    trustme = pytest.importorskip("trustme")
    authority = trustme.CA(organization_name="a private CA")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = S3Server(0, FolderBucket(tiny_tree, BUCKET), SharedCounters(tmp_path / "counters.bin", create=True),
                      tls=context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"https://127.0.0.1:{server.port}"
    for name, value in s3_environment({"endpoint": endpoint, "key": "test", "secret": "test"}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    location.set_timeout(5)
    location.forget_listings()
    try:
        yield {"endpoint": endpoint, "ca": tmp_path / "ca.pem", "tree": tiny_tree}
    finally:
        server.shutdown()
        server.server_close()
        location.forget_listings()
        location.set_timeout(location.DEFAULT_TIMEOUT_S)


def test_a_store_behind_a_private_ca_is_read_with_its_ca_bundle_and_refused_without(tls_store, s3_reader,
                                                                                     monkeypatch, tmp_path):
    """AWS_CA_BUNDLE is how botocore (so s3fs) trusts a private CA; obstore is handed the same PEM.
    Without it, the store's certificate is refused in one line that says so (not 'did not answer')."""
    key = sorted(p.relative_to(tls_store["tree"]).as_posix() for p in tls_store["tree"].rglob("*.jpg"))[0]
    path = as_path(f"s3://{BUCKET}/{key}")
    with pytest.raises(StorageError) as caught:
        location.read_many([path], 1)
    message = str(caught.value)
    assert message.startswith(f"{path}: the store at {tls_store['endpoint']} sent a TLS certificate this machine "
                              "does not trust (") and "expected AWS_CA_BUNDLE" in message and "\n" not in message

    monkeypatch.setenv("AWS_CA_BUNDLE", str(tls_store["ca"]))
    location.set_timeout(5)  # fresh clients that read the changed environment
    files = sorted(as_path(f"s3://{BUCKET}/").walk_files(), key=str)  # listed through s3fs
    assert len(files) == len(list(tls_store["tree"].rglob("*.jpg")))
    assert location.read_many(files, 8) == [(tls_store["tree"] / f.key).read_bytes() for f in files]

    if s3_reader == "obstore":  # botocore's own reading of a bad bundle is its business
        for bundle, why in ((tmp_path / "missing.pem", "a readable PEM file"), (tls_store["tree"] / key, "a PEM file")):
            monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
            location.set_timeout(5)
            with pytest.raises(StorageError, match=f"^AWS_CA_BUNDLE: expected {why} of CA certificates, got '{bundle}'"):
                location.read_many([path], 1)


def test_writes_land_under_their_name_and_update_the_listing(s3_env):
    out = as_path(f"s3://{BUCKET}/written")
    location.write_bytes(out / "a.txt", b"hello")
    location.forget_listings()
    assert (out / "a.txt").read_bytes() == b"hello"
    assert [p.name for p in out.iterdir()] == ["a.txt"]  # no temporary name left behind
    location.delete(out / "a.txt")
    assert not (out / "a.txt").exists()


@pytest.mark.parametrize("url, overrides, expected", [
    ("s3://no-such-bucket/tree", {}, "bucket 'no-such-bucket' does not exist"),
    (f"s3://{BUCKET}/tree", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "refused the credentials (SignatureDoesNotMatch)"),
    (f"s3://{BUCKET}/tree", {"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY"}, "refused the credentials (InvalidAccessKeyId)"),
])
def test_store_errors_are_one_line(s3_env, monkeypatch, url, overrides, expected):
    for name, value in overrides.items():
        monkeypatch.setenv(name, value)
    location.set_timeout(5)  # a fresh client that reads the changed environment
    with pytest.raises(StorageError) as caught:
        as_path(url).exists()
    message = str(caught.value)
    assert expected in message and message.startswith(url) and "\n" not in message


def test_no_credentials_and_a_dead_endpoint_are_one_line(s3_env, monkeypatch):
    from .conftest import free_port

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    location.set_timeout(5)
    with pytest.raises(StorageError, match="no credentials for s3://; expected AWS_ACCESS_KEY_ID"):
        as_path(f"s3://{BUCKET}/tree").exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_env["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env["secret"])
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    location.set_timeout(2)
    with pytest.raises(StorageError, match=f"the store at {dead} refused the connection"):  # listed through obstore
        as_path(f"s3://{BUCKET}/tree").exists()


def test_gcs_settings_fill_in_what_the_user_left_unset(monkeypatch):
    from stallscope.storage.tfdata_readers import describe_reader

    for name in ("GCS_REQUEST_CONNECTION_TIMEOUT_SECS", "GCS_REQUEST_IDLE_TIMEOUT_SECS", "GCS_METADATA_REQUEST_TIMEOUT_SECS",
                 "GCS_RETRY_CONFIG_MAX_RETRIES", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US", gcs_store.GCS_BLOCK_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GCS_REQUEST_IDLE_TIMEOUT_SECS", "99")  # the user's own value stays
    monkeypatch.setattr(gcs_store, "_set_by_us", set())
    made = gcs_store.prepare_gcs_environment(7, small_objects=True)
    assert "GCS_REQUEST_CONNECTION_TIMEOUT_SECS=7" in made and "GCS_READ_CACHE_BLOCK_SIZE_MB=1" in made
    assert not any(m.startswith("GCS_REQUEST_IDLE_TIMEOUT_SECS") for m in made)
    assert os.environ["GCS_REQUEST_IDLE_TIMEOUT_SECS"] == "99" and os.environ["GCS_RETRY_CONFIG_MAX_RETRIES"] == "2"
    files = [as_path("gs://bucket/tree/a/1.jpg")]
    assert describe_reader("files", files, read_parallelism=None, map_parallelism=None) == \
        "TF gs:// (GCS_READ_CACHE_BLOCK_SIZE_MB=1, set by stallscope)"
    monkeypatch.setenv(gcs_store.GCS_BLOCK_VAR, "4")
    monkeypatch.setattr(gcs_store, "_set_by_us", set())
    assert gcs_store.prepare_gcs_environment(7, small_objects=True) == []  # all set now, by "the user"
    assert describe_reader("files", files, read_parallelism=None, map_parallelism=None) == \
        "TF gs:// (GCS_READ_CACHE_BLOCK_SIZE_MB=4)"
    for reader in ("s3fs", "obstore"):
        monkeypatch.setenv(s3_request_plan.READER_ENV, reader)
        assert describe_reader("files", [as_path("s3://b/x.jpg")], read_parallelism=None, map_parallelism=-1) == \
            f"{reader} (16 in flight)"
    monkeypatch.delenv(s3_request_plan.READER_ENV)
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ssl/private-ca.pem")  # a private CA: obstore is given it too
    assert s3_request_plan.reader_name() == "obstore"
    monkeypatch.delenv("AWS_CA_BUNDLE")
    monkeypatch.setenv(s3_request_plan.READER_ENV, "boto")
    with pytest.raises(location.UsageError, match="STALLSCOPE_S3_READER: expected one of obstore, s3fs, got 'boto'"):
        describe_reader("files", [as_path("s3://b/x.jpg")], read_parallelism=None, map_parallelism=-1)
    assert describe_reader("files", [Path("x.jpg")], read_parallelism=None, map_parallelism=None) == "TF local files"


def test_shards_without_a_manifest_are_counted_and_labelled_from_the_bucket(s3_env):
    from stallscope.pipeline.sources import open_source

    client, records = s3_env["client"], s3_env["records"]
    for shard in sorted(records.glob("*.tfrecord")):
        client.put_object(Bucket=BUCKET, Key=f"bare/{shard.name}", Body=shard.read_bytes())
    source = open_source("records", f"s3://{BUCKET}/bare")
    local = open_source("records", records)
    assert source.num_examples == local.num_examples == 24 and source.schema == local.schema
    assert source.labels == ("0", "1", "2") and source.total_bytes == local.total_bytes
    assert [str(p) for p in source.files] == [f"s3://{BUCKET}/bare/{p.name}" for p in local.files]


def test_a_files_source_in_a_bucket_is_the_local_trees_images_held_as_text(s3_env):
    """Each image is its `s3://bucket/key` text, sized from the listing: a RemotePath per object cost 9 s
    of CPU and 565 MB at the peak for ImageNet's train set (1.28 million objects)."""
    from stallscope.pipeline.sources import open_source
    from stallscope.storage.tfdata_readers import describe_reader, needs_own_reader

    source = open_source("files", f"s3://{BUCKET}/tree")
    local = open_source("files", s3_env["tree"])
    assert all(type(p) is str for p in source.files)
    assert list(source.files) == [f"s3://{BUCKET}/tree/{Path(p).relative_to(s3_env['tree']).as_posix()}" for p in local.files]
    assert source.file_labels == local.file_labels and source.total_bytes == local.total_bytes == sum(
        Path(p).stat().st_size for p in local.files)
    assert needs_own_reader(source.files) and not needs_own_reader(local.files)  # s3:// read by stallscope
    assert describe_reader("files", source.files, read_parallelism=None, map_parallelism=-1).endswith("(16 in flight)")


def test_a_listing_gives_each_folders_objects_sorted_and_keeps_up_with_changes():
    """A walk of one folder is a slice of the listing's sorted names: names that share the folder's
    text but not its slash ("a-b/", "a.txt", "ab/") sort around it and stay out."""
    info = location.ObjectInfo(size=1, mtime_ns=0)
    names = ["a/x", "a/b/y", "a-b/z", "a.txt", "ab/w", "a/.hidden/q", "a0", "", "b/a/x"]
    listing = location.Listing(as_path("gs://bucket/tree"), {name: info for name in names})
    assert listing.names_under("a") == ["a/.hidden/q", "a/b/y", "a/x"]
    assert listing.names_under("a/b") == ["a/b/y"]
    assert listing.names_under("b") == ["b/a/x"] and listing.names_under("c") == []
    assert listing.names_under("") == sorted(set(names) - {""})  # the root's own object is not below it
    listing.add("a/c", info)
    listing.remove("a/x")
    assert listing.names_under("a") == ["a/.hidden/q", "a/b/y", "a/c"]
