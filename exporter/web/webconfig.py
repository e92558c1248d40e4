"""The optional web config file (TLS, basic auth) of the HTTP edge, in the exporter-toolkit format.

It sits beside server.py at the very end of the pipeline and touches no event: it only decides who may read
/metrics, /healthz, /events and the page, and over what. The file has the shape of exporter-toolkit's
web-config.yml, so a file written for node_exporter works when it uses only the supported keys:

    tls_server_config:
      cert_file: server.crt            # relative paths are resolved against this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: clients-ca.crt
      min_version: TLS12               # TLS10..TLS13; TLS12 by default
    basic_auth_users:
      alice: $2y$10$...                # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Every problem in the file is reported at once in one WebConfigError (a ValueError) naming the key path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt

from ..errors import ProblemsError

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType(
    {
        "TLS10": ssl.TLSVersion.TLSv1,
        "TLS11": ssl.TLSVersion.TLSv1_1,
        "TLS12": ssl.TLSVersion.TLSv1_2,
        "TLS13": ssl.TLSVersion.TLSv1_3,
    }
)
# exporter-toolkit's client_auth_type values that Python's ssl can honour. RequestClientCert and
# RequireAnyClientCert ask for a certificate without verifying it, which the ssl module cannot do.
CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode] = MappingProxyType(
    {
        "NoClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }
)
_TOP_KEYS = frozenset({"tls_server_config", "basic_auth_users"})
_TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"})
_BCRYPT_RE = re.compile(r"^\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}$")
# bcrypt only looks at the first 72 bytes; a longer password is refused rather than silently truncated.
_BCRYPT_MAX_PASSWORD = 72
_CACHE_LIMIT = 1024  # cached outcomes of each polarity; a full cache of failures drops its oldest tenth
# bcrypt checks at once: each takes a core for tens of milliseconds (more at a higher cost), and wrong passwords
# from many clients must not take the cores the daemon reads logs with. A check waits this long for its turn.
_HASH_CHECKS_AT_ONCE = 1
_HASH_WAIT_SECONDS = 5.0


class WebConfigError(ProblemsError):
    """Every problem found in a web config file, one per line."""


@dataclass(frozen=True, slots=True)
class WebConfig:
    """TLS and basic auth settings of the HTTP server; the defaults mean plain HTTP without auth."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def tls_enabled(self) -> bool:
        """Whether the server speaks TLS."""
        return self.tls_cert_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side SSLContext for these settings, or None without TLS (OSError/SSLError if unloadable)."""
        if self.tls_cert_file is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version is not None:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_client_ca_file is not None:
            ctx.load_verify_locations(cafile=self.tls_client_ca_file)
        ctx.verify_mode = CLIENT_AUTH_TYPES[self.client_auth_type]
        return ctx


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web config file; raise WebConfigError (a ValueError) listing every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError([f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"]) from exc
    import yaml  # only with --web-config: PyYAML costs about 25 ms of start-up

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise WebConfigError([f"{path}: {where}not valid YAML: {getattr(exc, 'problem', None) or exc}"]) from exc
    problems: list[str] = []
    config = _build(data if data is not None else {}, path.parent, problems)
    if config is not None and not problems:
        _check_loadable(config, problems)
    if problems or config is None:
        raise WebConfigError([f"{path}: {p}" for p in problems])
    return config


def _build(data: Any, base: Path, problems: list[str]) -> WebConfig | None:
    if not isinstance(data, dict):
        problems.append("the web config must be a mapping (tls_server_config, basic_auth_users)")
        return None
    for key in sorted(set(map(str, data)) - _TOP_KEYS):
        problems.append(f"{key}: unknown key (supported: {', '.join(sorted(_TOP_KEYS))})")
    tls = _tls(data.get("tls_server_config"), base, problems)
    users = _users(data.get("basic_auth_users"), problems)
    return WebConfig(**tls, basic_auth_users=MappingProxyType(users))


def _file(raw: Mapping[str, Any], key: str, base: Path, problems: list[str]) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.append(f"tls_server_config.{key}: must be a file path")
        return None
    resolved = base / value  # an absolute value replaces base, as exporter-toolkit's SetDirectory does
    if not resolved.is_file():
        problems.append(f"tls_server_config.{key}: {resolved}: no such file")
    return str(resolved)


def _choice(
    raw: Mapping[str, Any], key: str, choices: Mapping[str, Any], default: str | None, problems: list[str]
) -> Any:
    value = raw.get(key, default)
    if value is not None and value not in choices:
        problems.append(f"tls_server_config.{key}: {value!r} is not one of {', '.join(choices)}")
        return default
    return value


def _tls(raw: Any, base: Path, problems: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("tls_server_config: must be a mapping")
        return {}
    for key in sorted(set(map(str, raw)) - _TLS_KEYS):
        problems.append(f"tls_server_config.{key}: unknown key (supported: {', '.join(sorted(_TLS_KEYS))})")
    out: dict[str, Any] = {
        "tls_cert_file": _file(raw, "cert_file", base, problems),
        "tls_key_file": _file(raw, "key_file", base, problems),
        "tls_client_ca_file": _file(raw, "client_ca_file", base, problems),
        "client_auth_type": _choice(raw, "client_auth_type", CLIENT_AUTH_TYPES, "NoClientCert", problems),
        "min_version": _choice(raw, "min_version", TLS_VERSIONS, "TLS12", problems),
        "max_version": _choice(raw, "max_version", TLS_VERSIONS, None, problems),
    }
    if (out["tls_cert_file"] is None) != (out["tls_key_file"] is None):
        problems.append("tls_server_config: cert_file and key_file must be given together")
    verifies = out["client_auth_type"] != "NoClientCert"
    if out["tls_cert_file"] is None and (verifies or out["tls_client_ca_file"] is not None):
        problems.append("tls_server_config: client certificates need cert_file and key_file")
    if verifies and out["tls_client_ca_file"] is None:
        problems.append(f"tls_server_config.client_auth_type: {out['client_auth_type']} needs client_ca_file")
    if not verifies and out["tls_client_ca_file"] is not None:
        problems.append("tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert")
    return out


def _users(raw: Any, problems: list[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("basic_auth_users: must be a mapping of user name to bcrypt hash")
        return {}
    users: dict[str, str] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"basic_auth_users: {user!r}: a user name is a non-empty string without ':'")
        elif not isinstance(hashed, str) or not _BCRYPT_RE.match(hashed):
            problems.append(f"basic_auth_users.{user}: not a bcrypt hash ($2y$..., 60 characters)")
        else:
            users[user] = hashed
    return users


def _check_loadable(config: WebConfig, problems: list[str]) -> None:
    """Fail at startup, not at the first scrape, when a certificate or key does not load."""
    try:
        config.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        problems.append(f"tls_server_config: cannot load the certificate, key or client CA: {exc}")


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes, at a bounded cost.

    As exporter-toolkit's handler does: the outcome of each (user, hash, password) is cached, so a scraper
    with a stale password costs one bcrypt check, not one per scrape; bcrypt runs one check at a time; and an
    unknown user is checked against a dummy hash of the configured users' cost, so a check costs the same
    whether the user exists or not (user names cannot be told apart by timing).
    """

    realm = "sglang-oom-exporter"

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {u: h.encode("ascii") for u, h in users.items()}
        self._lock = threading.Lock()
        # sha256 of (user, hash, password) -> outcome. The hash is in the key, so a changed hash needs a new
        # check. Failures have their own bound: a flood of wrong passwords cannot evict the good credentials.
        self._ok: set[bytes] = set()
        self._bad: dict[bytes, None] = {}
        self._hashing = threading.BoundedSemaphore(_HASH_CHECKS_AT_ONCE)
        # Unknown users are checked against a dummy hash of the highest configured cost, made on first use.
        self._dummy_cost = max((int(h.split(b"$")[2]) for h in self._users.values()), default=10)
        self._dummy: bytes | None = None

    def check(self, authorization: str | None) -> bool:
        """Whether the header carries a known user and that user's password."""
        creds = _parse_basic(authorization)
        if creds is None:
            return False
        user, password = creds
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        with self._lock:
            if key in self._ok:
                return hashed is not None
            if key in self._bad:
                return False
        if not self._hashing.acquire(timeout=_HASH_WAIT_SECONDS):
            return False  # too many checks queued: refused, not cached
        try:
            ok = self._bcrypt(password, hashed) and hashed is not None
        finally:
            self._hashing.release()
        with self._lock:
            if ok:
                if len(self._ok) >= _CACHE_LIMIT:
                    self._ok.clear()
                self._ok.add(key)
            else:
                if len(self._bad) >= _CACHE_LIMIT:
                    for old in list(self._bad)[: _CACHE_LIMIT // 10]:
                        del self._bad[old]
                self._bad[key] = None
        return ok

    def _bcrypt(self, password: bytes, hashed: bytes | None) -> bool:
        """One bcrypt computation at the user's cost, or at the dummy's for an unknown user."""
        if hashed is not None or len(password) > _BCRYPT_MAX_PASSWORD:
            return hashed is not None and _bcrypt_check(password, hashed)
        if self._dummy is None:
            # Making the dummy costs what a check costs: this first unknown user pays it instead of a check.
            self._dummy = bcrypt.hashpw(password, bcrypt.gensalt(rounds=self._dummy_cost))
            return False
        _bcrypt_check(password, self._dummy)
        return False


def _parse_basic(authorization: str | None) -> tuple[str, bytes] | None:
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    if len(password) > _BCRYPT_MAX_PASSWORD:
        return False
    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:
        return False
