"""The web config loader (exporter-toolkit format) and the basic auth checker."""

from __future__ import annotations

import base64
import textwrap

import pytest

from sglang_oom_exporter.web import webconfig
from sglang_oom_exporter.web.webconfig import BasicAuth, WebConfig, WebConfigError, load_web_config
from tests.support.helpers import openssl_cert

bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the bcrypt package")


def hashed(password=b"s3cret"):
    """A bcrypt hash in the $2y$ spelling that htpasswd writes."""
    return bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")


def write(tmp_path, text):
    path = tmp_path / "web-config.yml"
    path.write_text(textwrap.dedent(text))
    return path


def header(user, password):
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


# Loading


def test_full_config_with_paths_relative_to_the_file(tmp_path):
    openssl_cert(tmp_path)
    openssl_cert(tmp_path, "clients")
    user_hash = hashed()
    path = write(
        tmp_path,
        f"""\
        tls_server_config:
          cert_file: server.crt
          key_file: {tmp_path / "server.key"}
          client_auth_type: VerifyClientCertIfGiven
          client_ca_file: clients.crt
          min_version: TLS13
        basic_auth_users:
          prometheus: {user_hash}
        """,
    )
    config = load_web_config(path)
    assert (
        WebConfig(
            tls_cert_file=str(tmp_path / "server.crt"),
            tls_key_file=str(tmp_path / "server.key"),
            tls_client_ca_file=str(tmp_path / "clients.crt"),
            client_auth_type="VerifyClientCertIfGiven",
            min_version="TLS13",
            basic_auth_users={"prometheus": user_hash},
        )
        == config
    )
    assert config.tls_enabled
    assert config.ssl_context() is not None


def test_empty_file_means_plain_http_without_auth(tmp_path):
    config = load_web_config(write(tmp_path, ""))
    assert WebConfig() == config
    assert not config.tls_enabled
    assert config.ssl_context() is None


def test_basic_auth_only(tmp_path):
    config = load_web_config(write(tmp_path, f"basic_auth_users:\n  alice: {hashed()}\n"))
    assert list(config.basic_auth_users) == ["alice"]
    assert not config.tls_enabled


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tls_server_config: {}\nhttp_server_config: {http2: true}\n", "http_server_config: unknown key"),
        ("tls_server_config:\n  cert_file: a.crt\n  cipher_suites: []\n", "tls_server_config.cipher_suites: unknown"),
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", "missing.crt: no such file"),
        ("tls_server_config:\n  min_version: TLS14\n", "min_version: 'TLS14' is not one of TLS10"),
        ("tls_server_config:\n  client_auth_type: RequestClientCert\n", "'RequestClientCert' is not one of"),
        ("tls_server_config: [cert_file]\n", "tls_server_config: must be a mapping"),
        ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice: not a bcrypt hash"),
        ("basic_auth_users: [alice]\n", "basic_auth_users: must be a mapping"),
        ("- just\n- a list\n", "must be a mapping"),
        ("tls_server_config:\n  cert_file: [unclosed\n", "not valid YAML"),
        ("basic_auth_users: {alice: $2y$}\n  bad: indent\n", "line 2: not valid YAML"),
    ],
)
def test_bad_config_is_a_value_error_naming_the_problem(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=r"web-config\.yml") as info:
        load_web_config(path)
    assert problem in str(info.value)


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path, "tls_server_config:\n  min_version: SSL3\n  ciphers: x\nextra: 1\n")
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    assert len(info.value.problems) == 3


def test_cert_and_key_must_come_together(tmp_path):
    openssl_cert(tmp_path)
    with pytest.raises(ValueError, match="cert_file and key_file must be given together"):
        load_web_config(write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n"))


def test_client_ca_needs_a_verifying_client_auth_type(tmp_path):
    openssl_cert(tmp_path)
    text = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: server.crt\n"
    with pytest.raises(ValueError, match="client_ca_file: set, but client_auth_type is NoClientCert"):
        load_web_config(write(tmp_path, text))


def test_verifying_client_auth_type_needs_a_client_ca(tmp_path):
    openssl_cert(tmp_path)
    text = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    text += "  client_auth_type: RequireAndVerifyClientCert\n"
    with pytest.raises(ValueError, match="RequireAndVerifyClientCert needs client_ca_file"):
        load_web_config(write(tmp_path, text))


def test_a_key_that_does_not_load_fails_at_load_time(tmp_path):
    openssl_cert(tmp_path)
    (tmp_path / "server.key").write_text("not a key\n")
    text = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    with pytest.raises(ValueError, match="cannot load the certificate"):
        load_web_config(write(tmp_path, text))


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_web_config(tmp_path / "absent.yml")


# Basic auth


def test_basic_auth_accepts_the_right_password_only():
    auth = BasicAuth({"alice": hashed(), "bob": hashed(b"other")})
    assert auth.check(header("alice", b"s3cret"))
    assert auth.check(header("bob", b"other"))
    assert not auth.check(header("alice", b"other"))
    assert not auth.check(header("mallory", b"s3cret"))
    assert not auth.check(header("alice", b"s3cret" * 20))  # over bcrypt's 72 bytes: refused, not truncated


@pytest.mark.parametrize(
    "value",
    [None, "", "Bearer abc", "Basic", "Basic !!!not-base64", "Basic " + base64.b64encode(b"no-colon").decode()],
)
def test_basic_auth_refuses_malformed_headers(value):
    assert not BasicAuth({"alice": hashed()}).check(value)


def test_basic_auth_caches_both_outcomes(monkeypatch):
    auth = BasicAuth({"alice": hashed()})
    calls = []
    real = bcrypt.checkpw

    def counting(password, hashed_password):
        calls.append(password)
        return real(password, hashed_password)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", counting)
    for _ in range(3):
        assert auth.check(header("alice", b"s3cret"))
        assert not auth.check(header("alice", b"wrong"))
    assert calls == [b"s3cret", b"wrong"]  # a stale password costs one check, not one per scrape
