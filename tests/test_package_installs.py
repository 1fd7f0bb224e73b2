"""`npm install` and `pip install` in a `coder` session, through the "proxy" network, against
local HTTPS stand-ins for their registries, set up as a user behind a mirror would have it.

The stand-ins serve a package built by the test (an npm tarball and its packument; a pure-Python
wheel and its PEP 503 page) over TLS, with a certificate of a CA made for the test, on the
host's loopback. The session reaches them by a name pinned to 127.0.0.1 (`--allow-host
NAME:PORT=127.0.0.1`, as an internal mirror is listed), and the launcher's environment names
the registry and the CA as a user's would (NPM_CONFIG_REGISTRY, NODE_EXTRA_CA_CERTS and
NPM_CONFIG_CAFILE; PIP_INDEX_URL and PIP_CERT): the node, python and tls profiles pass them
and bind the CA. Each install has a twin without the registry listed, which fails with the
proxy's refusal.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import LocalCA, make_local_ca, serving, session, sh

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]

# The names the stand-ins answer to, inside the session (pinned to the host's loopback).
NPM_REGISTRY = "registry.test"
PYTHON_INDEX = "index.test"
# The package both registries serve, and what its code answers when run.
PACKAGE = "nsconfine-probe"
GREETING = "hello from the registry stand-in"


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCA:
    """The test's CA and a certificate it signed for both stand-ins' names."""
    return make_local_ca(tmp_path_factory.mktemp("ca"), [NPM_REGISTRY, PYTHON_INDEX])


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves a fixed set of files by path, as a registry's static content, and notes every
    path asked."""

    files: dict[str, tuple[str, bytes]]  # path -> (content type, body)
    asked: list[str]

    def do_GET(self) -> None:
        self.asked.append(self.path)
        content_type, body = self.files.get(self.path.split("?")[0], ("text/plain", b""))
        self.send_response(200 if body else 404)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Registry:
    """A stand-in registry on the host's loopback: its port, the CA its certificate chains
    to, the files it serves (filled in once the port is known, as their URLs name it) and the
    paths it was asked for."""

    port: int
    ca: Path
    files: dict[str, tuple[str, bytes]]
    asked: list[str]


@pytest.fixture
def registry(local_ca: LocalCA) -> Iterator[Registry]:
    """An HTTPS stand-in with the test CA's certificate, serving nothing yet."""
    files: dict[str, tuple[str, bytes]] = {}
    asked: list[str] = []
    handler = type("Handler", (_Files,), {"files": files, "asked": asked})
    with serving(handler, local_ca) as port:
        yield Registry(port, local_ca.ca, files, asked)


@pytest.fixture(params=[True, False], ids=["listed", "not-listed"])
def listed(request: pytest.FixtureRequest) -> bool:
    """Whether the session's allowlist names the stand-in (the twin: it does not)."""
    return bool(request.param)


@pytest.fixture(autouse=True)
def launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clears the launcher's settings that the profiles would pass along and that would change
    what is tested: another index or links for pip, hosts it need not verify, and the CA
    bundles that requests prefers to pip's PIP_CERT (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE: this
    CI machine sets them to the system's)."""
    for name in (
        "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST", "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE", "npm_config_registry", "npm_config_cafile",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _install(ws_run: tuple[Path, Path], pinned: str | None, command: str) -> tuple[int, str, Path]:
    """command's status and output, run in the workspace of a coder session that lists the
    pinned registry (or none), and the proxy's audit file (beside the workspace, in the test's
    own directory: out of the session's reach)."""
    audit = ws_run[0].parent / "audit.jsonl"
    listed = [pinned] if pinned else []
    plan = session(*ws_run, profile=["coder"], allow_hosts=listed, audit=str(audit)).plan()
    assert plan.network == "proxy"
    status, output = sh(plan, f"cd {ws_run[0]} && {command}")
    return status, output, audit


def _check_audit(audit: Path, host: str, listed: bool) -> None:
    """Every connection the proxy audited went to host: allowed as the launcher listed it, or
    refused because the allowlist does not name it."""
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    expected = (
        (host, "allowed", "named by the launcher (--allow-host)")
        if listed
        else (host, "refused", f"{host} is not on this session's allowlist")
    )
    assert {(r["host"], r["decision"], r["reason"]) for r in records} == {expected}, records


# -- npm --------------------------------------------------------------------------------------

# What the package's code is, and what the session runs to use it (no retries: the stand-in is
# on the host's loopback, and a failing run should fail at once).
_INDEX_JS = f"module.exports.greet = () => {json.dumps(GREETING)};\n".encode()
_NPM_INSTALL = (
    f"npm install --no-audit --fetch-retries 0 {PACKAGE} && "
    f"node -e 'console.log(require(\"{PACKAGE}\").greet())'"
)


def _npm_tarball() -> bytes:
    """The package as `npm pack` makes it: a gzipped tar with everything under package/."""
    manifest = {"name": PACKAGE, "version": "1.0.0", "main": "index.js", "license": "MIT"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in [
            ("package/package.json", json.dumps(manifest).encode()),
            ("package/index.js", _INDEX_JS),
        ]:
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(content), 0o644
            tar.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


def _serve_npm_package(registry: Registry) -> None:
    """The packument (as the registry serves it: dist.tarball on the registry, with its
    integrity and shasum) and the tarball it names."""
    tarball = _npm_tarball()
    tarball_path = f"/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz"
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    version = {
        "name": PACKAGE,
        "version": "1.0.0",
        "main": "index.js",
        "dist": {
            "tarball": f"https://{NPM_REGISTRY}:{registry.port}{tarball_path}",
            "integrity": integrity,
            "shasum": hashlib.sha1(tarball).hexdigest(),
        },
    }
    packument = {"name": PACKAGE, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
    registry.files[f"/{PACKAGE}"] = ("application/json", json.dumps(packument).encode())
    registry.files[tarball_path] = ("application/octet-stream", tarball)


def test_npm_install_through_the_proxy(
    ws_run: tuple[Path, Path], registry: Registry, listed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`npm install` in a coder session fetches the packument and the tarball from the
    registry the launcher's NPM_CONFIG_REGISTRY names, through the proxy (verified with the CA
    the launcher names): the package lands in node_modules and its code runs. Not listed, the
    install fails and the proxy's audit says why."""
    if shutil.which("npm") is None:  # the README's set-up installs no npm; CI's does
        pytest.skip("npm is not installed (apt-get install npm)")
    _serve_npm_package(registry)
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"https://{NPM_REGISTRY}:{registry.port}/")
    # node's variable for a CA, and npm's own: npm ignores node's where an npmrc names a cafile
    # (this CI machine's global npmrc does), so a user there sets both.
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(registry.ca))
    monkeypatch.setenv("NPM_CONFIG_CAFILE", str(registry.ca))
    pinned = f"{NPM_REGISTRY}:{registry.port}=127.0.0.1" if listed else None
    status, output, audit = _install(ws_run, pinned, _NPM_INSTALL)
    installed = ws_run[0] / "node_modules" / PACKAGE / "index.js"
    if listed:
        assert status == 0, output
        assert output.splitlines()[-1] == GREETING, output
        assert installed.read_bytes() == _INDEX_JS
        assert registry.asked == [f"/{PACKAGE}", f"/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz"]
    else:
        assert status != 0, output
        assert f"403 Forbidden - GET https://{NPM_REGISTRY}:{registry.port}/" in output, output
        assert not installed.exists()
        assert registry.asked == []
    _check_audit(audit, NPM_REGISTRY, listed)


# -- pip --------------------------------------------------------------------------------------

_MODULE = PACKAGE.replace("-", "_")
_INIT_PY = f"def greet():\n    return {GREETING!r}\n".encode()
_WHEEL = f"{_MODULE}-1.0-py3-none-any.whl"
# A venv in the workspace (Debian's python refuses to install into itself), the install from
# the index the launcher's PIP_INDEX_URL names (no retries, as for npm), and the module
# imported from the venv.
_PIP_INSTALL = (
    f"python3 -m venv venv && venv/bin/pip install --retries 0 {PACKAGE} && "
    f"venv/bin/python -c 'import {_MODULE}; print({_MODULE}.greet())'"
)


def _urlsafe_sha256(content: bytes) -> str:
    """A file's hash as a wheel's RECORD gives it (PEP 376: urlsafe base64, no padding)."""
    return base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()


def _wheel() -> bytes:
    """A pure-Python wheel as a build backend makes one: the module, and its .dist-info with
    METADATA, WHEEL and a RECORD of every file's hash (pip checks them)."""
    info = f"{_MODULE}-1.0.dist-info"
    files = {
        f"{_MODULE}/__init__.py": _INIT_PY,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: nsconfine-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = [f"{name},sha256={_urlsafe_sha256(data)},{len(data)}" for name, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
    return buffer.getvalue()


def _serve_python_package(registry: Registry) -> None:
    """The project's PEP 503 page (a link to the wheel with its sha256) and the wheel."""
    wheel = _wheel()
    digest = hashlib.sha256(wheel).hexdigest()
    page = f'<html><body><a href="/files/{_WHEEL}#sha256={digest}">{_WHEEL}</a></body></html>'
    registry.files[f"/simple/{PACKAGE}/"] = ("text/html", page.encode())
    registry.files[f"/files/{_WHEEL}"] = ("application/octet-stream", wheel)


def test_pip_install_through_the_proxy(
    ws_run: tuple[Path, Path], registry: Registry, listed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pip install` in a coder session fetches the project's page and its wheel from the
    index the launcher's PIP_INDEX_URL names, through the proxy (verified with the CA PIP_CERT
    names): the wheel lands in the workspace's venv and imports. Not listed, the install fails
    and the proxy's audit says why."""
    _serve_python_package(registry)
    monkeypatch.setenv("PIP_INDEX_URL", f"https://{PYTHON_INDEX}:{registry.port}/simple/")
    monkeypatch.setenv("PIP_CERT", str(registry.ca))
    pinned = f"{PYTHON_INDEX}:{registry.port}=127.0.0.1" if listed else None
    status, output, audit = _install(ws_run, pinned, _PIP_INSTALL)
    installed = list((ws_run[0] / "venv" / "lib").glob(f"python3*/site-packages/{_MODULE}"))
    if listed:
        assert status == 0, output
        assert output.splitlines()[-1] == GREETING, output
        assert [(path / "__init__.py").read_bytes() for path in installed] == [_INIT_PY]
        assert registry.asked == [f"/simple/{PACKAGE}/", f"/files/{_WHEEL}"]
    else:
        assert status != 0, output
        assert installed == []
        assert registry.asked == []
    _check_audit(audit, PYTHON_INDEX, listed)
