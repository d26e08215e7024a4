"""The s3:// endpoint is the one botocore's own clients would use, read through its public client."""

from __future__ import annotations

import botocore.session
import pytest

from stallscope.storage.s3_obstore import ENDPOINT_INPUTS, endpoint_url


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """A clean AWS configuration: no endpoint, region or profile from the machine's."""
    for name in (*ENDPOINT_INPUTS, "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return config


def test_no_endpoint_configured_is_aws_own(aws):
    assert endpoint_url(botocore.session.Session()) is None


def test_the_s3_variable_wins_over_the_general_one(aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    assert endpoint_url(botocore.session.Session()) == "http://127.0.0.1:9001"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9002")
    assert endpoint_url(botocore.session.Session()) == "http://127.0.0.1:9002"


def test_a_profiles_services_section_names_the_s3_endpoint(aws, monkeypatch):
    aws.write_text("[profile store]\nregion = eu-west-1\nservices = local\n\n"
                   "[services local]\ns3 =\n  endpoint_url = http://127.0.0.1:9003\n")
    monkeypatch.setenv("AWS_PROFILE", "store")
    assert endpoint_url(botocore.session.Session()) == "http://127.0.0.1:9003"


def test_configured_endpoints_can_be_ignored(aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert endpoint_url(botocore.session.Session()) is None


def test_the_endpoint_follows_the_environment_within_one_session(aws, monkeypatch):
    """A session lives for the process; a store started later in it names its own endpoint."""
    session = botocore.session.Session()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    assert endpoint_url(session) == "http://127.0.0.1:9001"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9004")
    assert endpoint_url(session) == "http://127.0.0.1:9004"
