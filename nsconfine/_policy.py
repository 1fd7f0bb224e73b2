"""Where a bind is refused: the deny set and the lint every plan passes before it launches.

A bind is judged by its resolved source (symlinks followed), because that is what the kernel
mounts: `~/link-to-ssh` is refused exactly like `~/.ssh`.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Sequence

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


def invoking_user_home() -> str:
    """The home of the user nsconfine runs as, from the password database."""
    return pwd.getpwuid(os.getuid()).pw_dir


def _resolve(path: str) -> str:
    # Deny rules name paths that often do not exist (no ~/.aws here): resolve what does exist
    # and keep the rest as written, so a later-created store is still covered by name.
    return os.path.realpath(path)


def home_rules(home: str) -> list[DenyRule]:
    """The home itself (no bind of it or above) and every credential store inside it."""
    home = _resolve(home)
    rules = [DenyRule(home, "the user's home directory: sessions get an empty HOME", False)]
    rules += [
        DenyRule(_resolve(os.path.join(home, name)), reason)
        for name, reason in HOME_CREDENTIAL_STORES
    ]
    return rules


def default_deny(homes: Sequence[str] = ()) -> tuple[DenyRule, ...]:
    """The deny set every plan starts with: each home and its stores, the host's secrets, the
    user's agent sockets and runtime keyrings."""
    rules: list[DenyRule] = []
    for home in {invoking_user_home(), *homes}:
        rules += home_rules(home)
    rules += [DenyRule(_resolve(path), reason) for path, reason in SYSTEM_SECRETS]
    runtime = f"/run/user/{os.getuid()}"
    rules.append(DenyRule(f"{runtime}/gnupg", "gpg-agent's sockets"))
    rules.append(DenyRule(f"{runtime}/keyring", "the desktop keyring's sockets"))
    agent = os.environ.get("SSH_AUTH_SOCK")
    if agent:
        rules.append(DenyRule(_resolve(agent), "the ssh-agent holding the user's keys"))
    return tuple(_unique(rules))


def deny_paths(paths: Iterable[str], reason: str) -> list[DenyRule]:
    """Rules for extra host paths no bind may expose (the data root, the canonical checkout)."""
    return [DenyRule(_resolve(path), reason) for path in paths]


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


def violated_rule(resolved_source: str, rules: Iterable[DenyRule]) -> DenyRule | None:
    """The first rule a bind of resolved_source would break, or None."""
    for rule in rules:
        if _is_within(rule.path, resolved_source):  # the source is the path or contains it
            return rule
        if rule.inside and _is_within(resolved_source, rule.path):
            return rule
    return None


def check_plan(plan: Plan) -> None:
    """Refuse the plan (PlanError) if any bind's source is missing, is `/`, or breaks a rule."""
    for entry in plan.entries:
        if not entry.is_host_bind:
            continue
        try:
            resolved = os.path.realpath(entry.source, strict=True)
        except OSError as error:
            raise PlanError(
                f"{entry.source} (for {entry.dest}) cannot be bound: {error.strerror}; "
                "create it or drop it from the session"
            ) from None
        if resolved == "/":
            raise PlanError(f"{entry.source} resolves to / and would expose the whole host")
        rule = violated_rule(resolved, plan.deny)
        if rule is not None:
            shown = entry.source if resolved == entry.source else f"{entry.source} (-> {resolved})"
            relation = "is or contains" if _is_within(rule.path, resolved) else "lies inside"
            raise PlanError(
                f"{shown} {relation} {rule.path} ({rule.reason}); no session may see it: "
                "bind a narrower path that holds no secrets"
            )
