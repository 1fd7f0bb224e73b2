"""The public surface: what `import nsconfine` offers, and that the tests use the install."""

from __future__ import annotations

from pathlib import Path

import nsconfine


def test_public_names_are_pinned() -> None:
    """__all__ is exactly the documented API, sorted."""
    assert nsconfine.__all__ == sorted(nsconfine.__all__)
    assert set(nsconfine.__all__) == {
        "Bind",
        "CredentialInsecure",
        "CredentialMissing",
        "DenyRule",
        "Entry",
        "EnvVar",
        "Harness",
        "Kind",
        "Mode",
        "NsconfineError",
        "Origin",
        "Plan",
        "PlanError",
        "Pool",
        "PreflightReport",
        "RunAs",
        "Sandbox",
        "SandboxUnavailable",
        "Session",
        "TimeoutExpired",
        "UsageError",
        "__version__",
        "preflight",
        "spawn",
        # the entry constructors, for a plan built by hand
        "copy",
        "data",
        "dev",
        "devpts",
        "directory",
        "proc",
        "remount_ro",
        "ro_bind",
        "rw_bind",
        "symlink",
        "tmpfs",
        "Stdio",  # what spawn's stdin, stdout and stderr take
    }
    assert all(getattr(nsconfine, name) is not None for name in nsconfine.__all__)


def test_the_asyncio_front_is_pinned() -> None:
    """nsconfine.aio offers spawn, Pool and their handle, Process, and nothing else."""
    import nsconfine.aio

    assert nsconfine.aio.__all__ == ["Pool", "Process", "spawn"]


def test_errors_carry_stable_codes_and_builtin_bases() -> None:
    """Each refusal has its code and exit status and is also the builtin it resembles."""
    assert (nsconfine.PlanError.code, nsconfine.PlanError.exit_status) == ("plan-refused", 65)
    assert issubclass(nsconfine.PlanError, ValueError)
    assert nsconfine.SandboxUnavailable.code == "sandbox-unavailable"
    assert nsconfine.SandboxUnavailable.exit_status == 69
    assert issubclass(nsconfine.CredentialMissing, FileNotFoundError)
    assert issubclass(nsconfine.CredentialInsecure, PermissionError)
    assert {nsconfine.CredentialMissing.exit_status, nsconfine.CredentialInsecure.exit_status} == {
        78
    }
    assert str(nsconfine.PlanError("no")) == "plan-refused: no"


def test_the_tests_import_the_installed_package() -> None:
    """The nsconfine the suite imports is the one pip installed (the wheel's files, or the
    tree an editable install points at), with its compiled parts beside it: never a source
    tree that merely shadows the install."""
    import importlib.metadata
    import json
    import sysconfig
    import urllib.parse

    # What pip recorded in this interpreter's site-packages (PYTHONPATH could shadow that too).
    site_packages = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    found = importlib.metadata.distributions(name="nsconfine", path=site_packages)
    distribution = next(iter(found))
    direct = json.loads(distribution.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        installed = Path(urllib.parse.urlparse(direct["url"]).path) / "nsconfine"
    else:
        installed = Path(str(distribution.locate_file("nsconfine")))
    package = Path(nsconfine.__file__).parent
    assert package.resolve() == installed.resolve(), (package, installed)
    assert list(package.glob("_native*.so")), package
    assert (package / "_shim").is_file()
    assert (package / "_reaper").is_file()


def test_nsconfine_needs_nothing_but_cffi() -> None:
    """The package's runtime dependency is cffi alone: importing it, building a plan and the
    CLI's start-up load no psutil (the bench's, in the [bench] extra)."""
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert [d.split(">")[0] for d in pyproject["project"]["dependencies"]] == ["cffi"]
    probe = (
        "import sys, nsconfine, nsconfine._cli.main, nsconfine._selftest.world, nsconfine._gate\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psutil', 'matplotlib')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", check=True
    )
    assert result.stdout.strip() == "[]"
