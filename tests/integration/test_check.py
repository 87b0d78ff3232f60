"""`shardcache check` against real origins (issue 27): a file root, an HTTP origin, S3 on moto
and on SeaweedFS with IAM identities (moto accepts any credentials), an HTTPS origin with a
self-signed certificate (real `openssl`), and a port nobody listens on. No daemon runs: the
command builds the origins as the daemon does and asks each with a HEAD."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import run_cli
from tests.origin_server import OriginServer
from tests.ports import free_port
from tests.s3_stores import client_for, env_for, seaweedfs_server
from tests.tls import self_signed, server_context

ACCESS_KEY, SECRET_KEY = "checker", "checker-secret"


@pytest.fixture
def tls_origin(tmp_path: Path) -> Iterator[OriginServer]:
    cert, key = self_signed(tmp_path)
    server = OriginServer(ssl_context=server_context(cert, key))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def seaweedfs_with_identities(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS whose S3 gateway accepts one identity's credentials only."""
    directory = tmp_path_factory.mktemp("seaweedfs-iam")
    identities = directory / "s3.json"
    identity = {
        "name": "checker",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Write"],
    }
    identities.write_text(json.dumps({"identities": [identity]}))
    with seaweedfs_server(directory, identities) as url:
        yield url


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_check_says_ok_per_origin_and_names_each_problem_in_one_line(
    tmp_path: Path, origin: OriginServer, tls_origin: OriginServer, moto_endpoint: str
) -> None:
    root = tmp_path / "shards"
    root.mkdir()
    (root / "s_000.tar").write_bytes(b"x" * 1000)
    origin.put("s_000.tar", b"y" * 2000)
    s3 = client_for(moto_endpoint)
    s3.create_bucket(Bucket="check-bucket")
    s3.put_object(Bucket="check-bucket", Key="data/s_000.tar", Body=b"z" * 3000)
    good = (
        f'[origins.files]\nurl = "file://{root}"\n'
        f'[origins.web]\nurl = "{origin.url}"\n'
        f'[origins.lake]\nurl = "s3://check-bucket/data"\n'
    )
    config = tmp_path / "good.toml"
    config.write_text(good)
    env = env_for(moto_endpoint)

    fine = run_cli("check", "--config", str(config), "--key", "lake/s_000.tar", env=env)
    assert fine.returncode == 0, fine.stderr
    assert fine.stderr == ""
    lines = _lines(fine.stdout)
    assert len(lines) == 3 and all(": OK (" in line for line in lines), lines
    assert any(line.startswith("lake: OK") and "s_000.tar: 2.93 KiB" in line for line in lines)
    assert any(line.startswith("lake: OK") for line in lines)

    closed = free_port()
    bad = good + (
        f'[origins.nobucket]\nurl = "s3://no-such-bucket-here/data"\n'
        f'[origins.selfsigned]\nurl = "{tls_origin.url}"\n'
        f'[origins.down]\nurl = "http://127.0.0.1:{closed}/d"\n'
        f'[origins.gone]\nurl = "file://{tmp_path / "missing"}"\n'
    )
    config.write_text(bad)
    found = run_cli("check", "--config", str(config), "--key", "web/absent.tar", env=env)
    assert found.returncode == 1, found.stdout + found.stderr
    problems = _lines(found.stderr)
    assert "Traceback" not in found.stderr
    by_origin = {line.split(":", 1)[0]: line for line in problems}
    assert sorted(by_origin) == ["down", "gone", "nobucket", "selfsigned", "web"], problems
    assert len(problems) == 5, problems  # one line each
    assert (
        "bucket missing" in by_origin["nobucket"] and "no-such-bucket-here" in by_origin["nobucket"]
    )
    assert "TLS certificate not trusted" in by_origin["selfsigned"]
    assert "unreachable" in by_origin["down"]
    assert "example key not found" in by_origin["web"] and "absent.tar" in by_origin["web"]
    assert "not a directory" in by_origin["gone"]
    assert sorted(line.split(":")[0] for line in _lines(found.stdout)) == ["files", "lake"]


def test_check_names_refused_credentials(seaweedfs_with_identities: str, tmp_path: Path) -> None:
    endpoint = seaweedfs_with_identities
    env = env_for(endpoint) | {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    import boto3

    admin = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    admin.create_bucket(Bucket="locked")
    origins = ["--origin", "lake=s3://locked"]

    accepted = run_cli("check", *origins, env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert "credentials accepted, bucket exists" in accepted.stdout

    wrong = env | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    refused = run_cli("check", *origins, env=wrong)
    assert refused.returncode == 1
    assert _lines(refused.stderr) == [refused.stderr.strip()], refused.stderr
    assert refused.stderr.startswith("lake: access denied, check the credentials")
    assert "403" in refused.stderr  # a HEAD's answer has no body to name the S3 error code

    nothing = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    nowhere = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}
    absent = env | nothing | nowhere | {"AWS_EC2_METADATA_DISABLED": "true"}
    refused = run_cli("check", *origins, env=absent)
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("lake: access denied, check the credentials")
    assert "no AWS credentials found" in refused.stderr

    # A profile that does not exist: the origin cannot even be built (it was a traceback).
    unbuilt = run_cli("check", *origins, env=absent | {"AWS_PROFILE": "no-such-profile"})
    assert unbuilt.returncode == 1 and "Traceback" not in unbuilt.stderr, unbuilt.stderr
    assert unbuilt.stderr.strip() == (
        "lake: cannot be built: origin 'lake': cannot make an S3 client: "
        "The config profile (no-such-profile) could not be found"
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "no origins configured"),
        (["--origin", "a=file:///tmp", "--key", "b/x.tar"], "no origin named 'b'"),
        (["--origin", "a=file:///tmp", "--key", "a/../x"], "--key 'a/../x'"),
        (["--origin", "a=ftp://h/p"], "unknown scheme"),
        (["--origin", "a=file:///tmp", "--kye", "a/x"], "did you mean --key?"),
    ],
)
def test_check_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = run_cli("check", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert needle in result.stderr
    assert len(_lines(result.stderr)) == 1 and "Traceback" not in result.stderr
