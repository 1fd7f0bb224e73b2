"""Where a bind is refused: the deny set and the lint every plan passes before it launches.

A bind is judged by its resolved source (symlinks followed), because that is what the kernel
mounts: `~/link-to-ssh` is refused exactly like `~/.ssh`.
"""

from __future__ import annotations

import bisect
import functools
import os
import pwd
from collections.abc import Iterable, Sequence

from nsconfine import _syscalls
from nsconfine._errors import PlanError
from nsconfine._plan import DenyRule, Plan

# Credential stores under a home directory, each with why it must stay out of every session.
HOME_CREDENTIAL_STORES: tuple[tuple[str, str], ...] = (
    (".ssh", "SSH keys and known hosts"),
    (".gnupg", "GnuPG private keys"),
    (".config", "application settings and secrets (gh, gcloud, agents, …)"),
    (".claude", "the host's Claude Code login and history"),
    (".claude.json", "the host's Claude Code settings and account"),
    (".git-credentials", "git's stored HTTPS passwords and tokens"),
    (".gitconfig", "git identity and credential helpers"),
    (".netrc", "passwords for FTP/HTTP hosts"),
    (".aws", "AWS keys"),
    (".azure", "Azure login"),
    (".docker", "registry logins"),
    (".kube", "Kubernetes cluster credentials"),
    (".npmrc", "npm registry tokens"),
    (".pypirc", "PyPI upload tokens"),
    (".cargo/credentials", "crates.io tokens"),
    (".cargo/credentials.toml", "crates.io tokens"),
    (".password-store", "pass(1) password store"),
    (".pki", "NSS certificate and key databases"),
    (".local/share/keyrings", "GNOME keyring"),
    (".terraform.d", "Terraform Cloud tokens"),
    (".vault-token", "HashiCorp Vault token"),
    (".cache/nsconfine", "nsconfine's own record of proven bwrap binaries"),
)

SYSTEM_SECRETS: tuple[tuple[str, str], ...] = (
    ("/etc/shadow", "the host's password hashes"),
    ("/etc/gshadow", "the host's group password hashes"),
    ("/etc/ssh", "the host's SSH host keys"),
    ("/etc/ssl/private", "the host's TLS private keys"),
    ("/run/docker.sock", "the Docker daemon: root on the host"),
    ("/var/run/docker.sock", "the Docker daemon: root on the host"),
)


@functools.cache
def _user(uid: int) -> pwd.struct_passwd:
    # Read once per uid: the password database costs a file parse per lookup.
    return pwd.getpwuid(uid)


def invoking_user() -> pwd.struct_passwd:
    """The password entry of the user nsconfine runs as."""
    return _user(os.getuid())


def invoking_user_home() -> str:
    """The home of the user nsconfine runs as, from the password database."""
    return invoking_user().pw_dir


def resolve(path: str) -> str:
    """path with its symlinks resolved, as far as it exists; the rest kept as written, so a
    rule still covers a store created later by its name."""
    try:
        return _syscalls.realpath(path)
    except OSError:
        parent, name = os.path.split(path)
        return path if parent == path else os.path.join(resolve(parent), name)


def home_rules(home: str) -> list[DenyRule]:
    """The home itself (no bind of it or above) and every credential store inside it."""
    home = resolve(home)
    rules = [DenyRule(home, "the user's home directory: sessions get an empty HOME", False)]
    rules += [
        DenyRule(resolve(os.path.join(home, name)), reason)
        for name, reason in HOME_CREDENTIAL_STORES
    ]
    return rules


_STORE_PARENTS = sorted({os.path.dirname(name) for name, _ in HOME_CREDENTIAL_STORES})
_default_deny_cache: dict[tuple[object, ...], tuple[DenyRule, ...]] = {}


def _directory_versions(homes: Iterable[str]) -> tuple[int, ...]:
    # Creating, removing or renaming a store changes its parent directory's mtime: the
    # resolved rules are reused only while none of those directories changed.
    versions = []
    for home in homes:
        for parent in _STORE_PARENTS:
            try:
                versions.append(os.stat(os.path.join(home, parent)).st_mtime_ns)
            except OSError:
                versions.append(-1)
    return tuple(versions)


def default_deny(homes: Sequence[str] = ()) -> tuple[DenyRule, ...]:
    """The deny set every plan starts with: each home and its stores, the host's secrets, the
    user's agent sockets and runtime keyrings."""
    all_homes = tuple(dict.fromkeys([invoking_user_home(), *homes]))
    agent = os.environ.get("SSH_AUTH_SOCK")
    key = (all_homes, os.getuid(), agent, _directory_versions(all_homes))
    cached = _default_deny_cache.get(key)
    if cached is not None:
        return cached
    rules: list[DenyRule] = []
    for home in all_homes:
        rules += home_rules(home)
    rules += [DenyRule(resolve(path), reason) for path, reason in SYSTEM_SECRETS]
    runtime = f"/run/user/{os.getuid()}"
    rules.append(DenyRule(f"{runtime}/gnupg", "gpg-agent's sockets"))
    rules.append(DenyRule(f"{runtime}/keyring", "the desktop keyring's sockets"))
    if agent:
        rules.append(DenyRule(resolve(agent), "the ssh-agent holding the user's keys"))
    result = tuple(_unique(rules))
    _default_deny_cache.clear()  # one host, one user: only the newest key is worth keeping
    _default_deny_cache[key] = result
    return result


def deny_paths(paths: Iterable[str], reason: str) -> list[DenyRule]:
    """Rules for extra host paths no bind may expose (the data root, the canonical checkout)."""
    return [DenyRule(resolve(path), reason) for path in paths]


def _unique(rules: Iterable[DenyRule]) -> list[DenyRule]:
    seen: set[tuple[str, bool]] = set()
    kept = []
    for rule in rules:
        if (rule.path, rule.inside) not in seen:
            seen.add((rule.path, rule.inside))
            kept.append(rule)
    return kept


def _is_within(path: str, ancestor: str) -> bool:
    return path == ancestor or ancestor == "/" or path.startswith(ancestor + "/")


class _DenyIndex:
    """The rules arranged so that judging one source costs a walk up its ancestors and one
    binary search, not a pass over every rule."""

    def __init__(self, rules: Sequence[DenyRule]) -> None:
        self.rules = tuple(rules)
        self.by_path = {rule.path: rule for rule in reversed(self.rules)}  # first rule wins
        self.inside = {rule.path: rule for rule in reversed(self.rules) if rule.inside}
        self.sorted_paths = sorted(self.by_path)

    def violated(self, source: str) -> DenyRule | None:
        # Is the source a denied path, or does it contain one?
        if source in self.by_path:
            return self.by_path[source]
        prefix = source.rstrip("/") + "/"
        at = bisect.bisect_left(self.sorted_paths, prefix)
        if at < len(self.sorted_paths) and self.sorted_paths[at].startswith(prefix):
            return self.by_path[self.sorted_paths[at]]
        # Does it lie inside a path denied with everything inside it?
        cut = len(source)
        while (cut := source.rfind("/", 0, cut)) > 0:
            rule = self.inside.get(source[:cut])
            if rule is not None:
                return rule
        return None


def violated_rule(resolved_source: str, rules: Sequence[DenyRule]) -> DenyRule | None:
    """A rule a bind of resolved_source would break, or None."""
    return _DenyIndex(rules).violated(resolved_source)


def check_plan(plan: Plan) -> None:
    """Refuse the plan (PlanError) if any bind's source is missing, is `/`, or breaks a rule."""
    index = _DenyIndex(plan.deny)  # built afresh: cheaper than hashing the rules to look it up
    for entry in plan.entries:
        if not entry.is_host_bind:
            continue
        try:
            resolved = _syscalls.realpath(entry.source)
        except OSError as error:
            raise PlanError(
                f"{entry.source} (for {entry.dest}) cannot be bound: "
                f"{os.strerror(error.errno or 0)}; create it or drop it from the session"
            ) from None
        if resolved == "/":
            raise PlanError(f"{entry.source} resolves to / and would expose the whole host")
        rule = index.violated(resolved)
        if rule is not None:
            shown = entry.source if resolved == entry.source else f"{entry.source} (-> {resolved})"
            relation = "is or contains" if _is_within(rule.path, resolved) else "lies inside"
            raise PlanError(
                f"{shown} {relation} {rule.path} ({rule.reason}); no session may see it: "
                "bind a narrower path that holds no secrets"
            )
