"""Where a bind is refused: the deny set, and the lint every plan passes before it launches.

The deny set is built from every home the launcher has: the password database's and $HOME
(they differ under systemd units, containers, `sudo -E`, test harnesses), the directories tools
are pointed at instead of a home's defaults ($XDG_CONFIG_HOME, $GNUPGHOME, $CLAUDE_CONFIG_DIR,
…), $SUDO_USER's home, and for a root launcher the home of the account a session runs as. Each
rule keeps the path as it was derived and says where it came from.

The lint judges what a path *is*, afresh on every check (nothing resolved is cached, so a
symlink re-pointed since the last launch counts at once):

- every rule and every bind source is resolved (symlinks followed) now;
- both are placed in their file system: the mount that holds them (from the launcher's own
  mount table) gives its device and the path inside that file system, so a bind-mount view of
  ~/.ssh at /tmp/view is ~/.ssh;
- a source is refused when it is, contains or lies inside a denied path in that sense, or when
  it is the very file (device and inode) a rule names, which a hardlink is;
- a masked path (nsconfine._plan.mask) is denied the same way to every bind but one that holds it,
  which passes only where the plan covers it (an empty read-only file or directory) at the
  very place that bind shows it.
"""

from __future__ import annotations

import bisect
import errno
import os
import pwd
import stat
from collections.abc import Iterable, Mapping, Sequence

from nsconfine._errors import PlanError
from nsconfine._kernel import syscalls as _syscalls
from nsconfine._kernel.accounts import (
    SEARCH,
    RunAs,
    allows,
    records_directory,
    refuse_planted_link,
    untrusted_reason,
)
from nsconfine._kernel.stub_records import FALLBACK_BASE
from nsconfine._kernel.walk import walk_path
from nsconfine._plan.model import TOOL_SOCKET_REASON, DenyRule, Entry, Kind, Mode, Plan
from nsconfine._text import file_kind, inside, is_decimal, printable, within

# Credential stores under a home directory, each with why it must stay out of every session.
HOME_CREDENTIAL_STORES: tuple[tuple[str, str], ...] = (
    (".ssh", "SSH keys and known hosts"),
    (".gnupg", "GnuPG private keys"),
    (".config", "application settings and secrets (gh, gcloud, agents, …)"),
    (".local/share", "application data (keyrings, tokens, histories)"),
    (".local/state", "application state (histories, sessions)"),
    (".claude", "the host's Claude Code login and history"),
    (".claude.json", "the host's Claude Code settings and account"),
    (".codex", "the host's Codex login and history"),
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
    (".m2/settings.xml", "Maven repository and server passwords"),
    (".m2/settings-security.xml", "Maven's master password"),
    (".gradle/gradle.properties", "Gradle repository and signing passwords"),
    (".gem/credentials", "RubyGems API keys"),
    (".yarnrc.yml", "Yarn registry tokens"),
    (".composer/auth.json", "Composer registry tokens"),
    (".nuget/NuGet/NuGet.Config", "NuGet feed passwords"),
    (".cache/huggingface/token", "the Hugging Face token"),
    (".cache/huggingface/stored_tokens", "Hugging Face tokens"),
    (".huggingface/token", "the Hugging Face token (its older place)"),
    (".pgpass", "PostgreSQL passwords"),
    (".my.cnf", "MySQL passwords"),
    (".s3cfg", "S3 keys"),
    (".boto", "Google Cloud Storage and AWS keys (boto)"),
    (".password-store", "pass(1) password store"),
    (".pki", "NSS certificate and key databases"),
    (".terraform.d", "Terraform Cloud tokens"),
    (".vault-token", "HashiCorp Vault token"),
)
RECORDS = ".cache/nsconfine"  # nsconfine's own, in every home (DenyRule.records)
RECORDS_REASON = "nsconfine's own records (proven bwrap binaries, mount points it made)"

# Variables that move a store out of the home: each names a directory or file a tool uses
# instead of the home's default. KUBECONFIG may list several files.
STORE_VARIABLES: tuple[tuple[str, str], ...] = (
    ("XDG_CONFIG_HOME", "application settings and secrets"),
    ("XDG_DATA_HOME", "application data (keyrings, tokens, histories)"),
    ("XDG_STATE_HOME", "application state (histories, sessions)"),
    ("GNUPGHOME", "GnuPG private keys"),
    ("CLAUDE_CONFIG_DIR", "Claude Code's login and settings"),
    ("CODEX_HOME", "Codex's login and settings"),
    ("DOCKER_CONFIG", "registry logins"),
    ("AWS_SHARED_CREDENTIALS_FILE", "AWS keys"),
    ("AWS_CONFIG_FILE", "AWS configuration and SSO tokens"),
    ("KUBECONFIG", "Kubernetes cluster credentials"),
    ("GIT_CONFIG_GLOBAL", "git identity and credential helpers"),
    ("HF_TOKEN_PATH", "the Hugging Face token"),
    ("PGPASSFILE", "PostgreSQL passwords"),
    ("BOTO_CONFIG", "Google Cloud Storage and AWS keys (boto)"),
    ("NPM_CONFIG_USERCONFIG", "npm registry tokens"),
)
# Variables that move a tool's home, in which one file holds its credentials (the home's own
# rules deny it under ~): that file is denied where the variable puts it. The rest of such a
# home is a cache, which a session may be given.
STORE_FILE_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("GRADLE_USER_HOME", "gradle.properties", "Gradle repository and signing passwords"),
    ("HF_HOME", "token", "the Hugging Face token"),
    ("HF_HOME", "stored_tokens", "Hugging Face tokens"),
    ("CARGO_HOME", "credentials", "crates.io tokens"),
    ("CARGO_HOME", "credentials.toml", "crates.io tokens"),
    ("COMPOSER_HOME", "auth.json", "Composer registry tokens"),
)

# A secret with more than one name (a hardlink) is the same secret under each. The denied
# directories are looked through this deep, and this far in all, for files with several names
# (key material sits near the top: ~/.ssh/id_*, ~/.config/gh/hosts.yml); a bound directory on
# the same file system as one is then looked through for another name of it, this far, and
# refused if it is too large to tell.
LINKED_DEPTH = 3
LINKED_SCAN = 5_000
BOUND_SCAN = 50_000

SYSTEM_SECRETS: tuple[tuple[str, str], ...] = (
    ("/etc/shadow", "the host's password hashes"),
    ("/etc/gshadow", "the host's group password hashes"),
    ("/etc/ssh", "the host's SSH host keys"),
    ("/etc/ssl/private", "the host's TLS private keys"),
    ("/run/docker.sock", "the Docker daemon: root on the host"),
    ("/var/run/docker.sock", "the Docker daemon: root on the host"),
    ("/run/podman", "the Podman service's socket: root on the host"),
    ("/run/containerd", "containerd's sockets: root on the host"),
    ("/run/crio", "CRI-O's socket: root on the host"),
    ("/run/libvirt", "libvirt's sockets: root on the host"),
    ("/run/dbus/system_bus_socket", "the D-Bus system bus: the host's services"),
)

# Sockets in a user's runtime directory ($XDG_RUNTIME_DIR, /run/user/UID) that hand out power.
RUNTIME_SOCKETS: tuple[tuple[str, str], ...] = (
    ("gnupg", "gpg-agent's sockets"),
    ("keyring", "the desktop keyring's sockets"),
    ("docker.sock", "a rootless Docker daemon: every container as that user"),
    ("podman/podman.sock", "a rootless Podman service: every container as that user"),
    ("bus", "the D-Bus session bus: the desktop's services (secrets, systemd --user)"),
    ("systemd", "systemd's user manager: starts any unit as that user"),
)


def _account(uid: int) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(uid)
    except KeyError:  # an account without a passwd entry (containers)
        return None


def resolve(path: str) -> str:
    """path with its symlinks resolved, as far as it exists; the rest kept as written, so a
    rule still covers a store created later by its name."""
    try:
        return _syscalls.realpath(path)
    except OSError:
        return _resolve_missing(path, {})


def _resolve_missing(path: str, memo: dict[str, str]) -> str:
    """path, which realpath could not resolve: its nearest ancestor that resolves, resolved,
    and the rest as written. Iterative (a path of thousands of components costs no stack);
    memo holds the resolved ancestors of missing paths (many rules share a home), the first
    _MEMO_DEPTH below what resolves."""
    below: list[tuple[str, str]] = []  # (directory, name) from path upwards
    current = path
    while True:
        parent, name = os.path.split(current)
        if parent == current:  # the root (or "" for a relative path): kept as it is
            resolved = current
            break
        below.append((parent, name))
        if parent in memo:
            resolved = memo[parent]
            break
        try:
            resolved = _syscalls.realpath(parent)
            break
        except OSError:
            current = parent
    for depth, (parent, name) in enumerate(reversed(below)):
        if depth < _MEMO_DEPTH:
            memo.setdefault(parent, resolved)
        resolved = os.path.join(resolved, name)
    return resolved


# The directories _resolve_missing remembers below what resolves: those rules share (~/.config,
# ~/.config/gcloud), not every parent of a deep path, whose names would take the square of
# its length.
_MEMO_DEPTH = 4


# Where sudo, doas and pkexec name the account that ran them (pkexec by uid).
INVOKER_VARIABLES = ("SUDO_USER", "DOAS_USER", "PKEXEC_UID")


def _invoker(value: str, by_uid: bool) -> pwd.struct_passwd | None:
    try:
        if by_uid:
            return pwd.getpwuid(int(value)) if is_decimal(value) else None
        return pwd.getpwnam(value) if value else None
    except (KeyError, ValueError, OverflowError):
        return None


def _owns_home(entry: pwd.struct_passwd) -> bool:
    # A system account's "home" (/usr/sbin for daemon, / for many) is a system directory it
    # does not own, where no credential store of its lives: denying it would deny /usr. A home
    # that does not exist (/nonexistent) holds nothing yet, and is denied by name.
    try:
        return os.stat(entry.pw_dir).st_uid == entry.pw_uid
    except OSError:
        return True


def homes_of(
    environ: Mapping[str, str], account: RunAs | None, extra: Sequence[str]
) -> list[tuple[str, str]]:
    """Every home the launcher has, each with where it came from, first occurrence kept."""
    found: list[tuple[str, str]] = []
    own = _account(os.getuid())
    if own is not None and _owns_home(own):
        found.append((own.pw_dir, f"the password database's home of {own.pw_name}"))
    if environ.get("HOME"):
        found.append((environ["HOME"], "$HOME"))
    for variable in INVOKER_VARIABLES:  # the person who became root, by whichever tool
        invoker = environ.get(variable, "")
        entry = _invoker(invoker, by_uid=variable == "PKEXEC_UID")
        if entry is not None and _owns_home(entry):
            found.append((entry.pw_dir, f"${variable} ({invoker})'s home"))
    if account is not None and account.uid != os.getuid():
        entry = _account(account.uid)
        if entry is not None and _owns_home(entry):
            found.append((entry.pw_dir, f"--user {account.name}'s home"))
    found += [(home, "a stand-in home") for home in extra]
    seen: set[str] = set()
    kept = []
    for home, origin in found:
        home = os.path.abspath(home)
        if home not in seen and home != "/":
            seen.add(home)
            kept.append((home, origin))
    return kept


def home_rules(home: str, origin: str) -> list[DenyRule]:
    """The home itself (no bind of it or above) and every credential store inside it."""
    rules = [
        DenyRule(home, "a home directory: sessions get an empty HOME", inside=False, origin=origin)
    ]
    rules += [
        DenyRule(os.path.join(home, name), reason, origin=origin)
        for name, reason in HOME_CREDENTIAL_STORES
    ]
    rules.append(DenyRule(os.path.join(home, RECORDS), RECORDS_REASON, origin=origin, records=True))
    return rules


def default_deny(
    homes: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    account: RunAs | None = None,
) -> tuple[DenyRule, ...]:
    """The deny set every plan starts with: each home and its stores, the stores tools are
    pointed at, the host's secrets, and the runtime sockets of the launcher and the account.
    homes: extra (stand-in) homes; environ: the launcher's environment."""
    environ = os.environ if environ is None else environ
    rules: list[DenyRule] = []
    every_home = homes_of(environ, account, homes)
    for home, origin in every_home:
        if os.path.isdir(home):
            rules += home_rules(home, origin)
        else:  # no store can be bound from a home that does not exist; it, by its name
            rules += home_rules(home, origin)[:1]
    for variable, reason in STORE_VARIABLES:
        value = environ.get(variable, "")
        for named in value.split(os.pathsep) if variable == "KUBECONFIG" else [value]:
            for path in _store_paths(named, [home for home, _ in every_home]):
                rules.append(DenyRule(path, reason, origin=f"${variable}"))
    for variable, name, reason in STORE_FILE_VARIABLES:
        value = environ.get(variable, "")
        if value:
            for path in _store_paths(os.path.join(value, name), [h for h, _ in every_home]):
                rules.append(DenyRule(path, reason, origin=f"${variable}"))
    # nsconfine's records wherever this environment puts them (HOME=/ puts them at /.cache,
    # which no home's rules cover), and where they go when the account has no writable home.
    records = [
        (records_directory("", environ), "where this launcher keeps them"),
        (os.path.join(FALLBACK_BASE, f"nsconfine-{os.geteuid()}"), "an account with no home"),
    ]
    rules += [
        DenyRule(os.path.normpath(path), RECORDS_REASON, origin=origin, records=True)
        for path, origin in records
    ]
    rules += [DenyRule(path, reason, origin="the host") for path, reason in SYSTEM_SECRETS]
    runtimes = [(f"/run/user/{os.getuid()}", "the launcher's runtime directory")]
    if environ.get("XDG_RUNTIME_DIR", "").startswith("/"):
        runtimes.append((environ["XDG_RUNTIME_DIR"], "$XDG_RUNTIME_DIR"))
    if account is not None and account.uid != os.getuid():
        runtimes.append((f"/run/user/{account.uid}", f"--user {account.name}'s runtime directory"))
    for runtime, origin in runtimes:
        if os.path.isdir(runtime):
            rules += [
                DenyRule(os.path.join(runtime, name), reason, origin=origin)
                for name, reason in RUNTIME_SOCKETS
            ]
    agent = environ.get("SSH_AUTH_SOCK", "")
    if agent.startswith("/"):
        rules.append(
            DenyRule(agent, "the ssh-agent holding the user's keys", origin="$SSH_AUTH_SOCK")
        )
    return tuple(_unique(rules))


def launch_rules(plan: Plan) -> tuple[DenyRule, ...]:
    """The rules a launch judges plan by: its own deny set, which is its maker's to edit
    (plan.replace(deny=...)), and the default set made afresh for the launcher's environment
    and the plan's account, which is not: no plan binds a credential store or a home."""
    return tuple(_unique((*plan.deny, *default_deny(account=plan.user))))


def _store_paths(named: str, homes: Sequence[str]) -> list[str]:
    """The paths a store variable's value names: itself if absolute; with a leading ~ (a
    systemd unit does not expand it, the tool does), the same path in every home."""
    if os.path.isabs(named):
        return [os.path.normpath(named)]
    if named == "~" or named.startswith("~/"):
        return [os.path.normpath(os.path.join(home, named[2:])) for home in homes]
    return []


def deny_paths(paths: Iterable[str], reason: str, origin: str) -> list[DenyRule]:
    """Rules for extra host paths no bind may expose (the data root, the canonical checkout)."""
    return [DenyRule(path, reason, origin=origin) for path in paths]


def _unique(rules: Iterable[DenyRule]) -> list[DenyRule]:
    seen: set[tuple[str, bool]] = set()
    kept = []
    for rule in rules:
        if (rule.path, rule.inside) not in seen:
            seen.add((rule.path, rule.inside))
            kept.append(rule)
    return kept


# ------------------------------------------------------------------ judging what a path is


def _parent(path: str) -> str:
    """The directory holding an absolute, normalized path (os.path.dirname, without its
    generality: the lint walks up hundreds of paths per check)."""
    return path[: path.rfind("/")] or "/"


class _Places:
    """Where paths lie in their file systems: (device, path inside the file system), from the
    launcher's mount table, read once per check."""

    def __init__(self) -> None:
        from nsconfine._kernel.mountinfo import MountTree, read_mountinfo

        self.tree = MountTree(read_mountinfo("self"))
        self.mounts = list(self.tree.mounts.values())  # (point, device, root), hidden ones too

    def of(self, resolved: str) -> tuple[str, str]:
        seen = self.tree.seen_at(resolved)
        if seen is None:
            return "", resolved
        point, device, root = seen
        rest = resolved[len(point) :] if point != "/" else resolved
        return device, os.path.normpath(root.rstrip("/") + "/" + rest.lstrip("/"))


class _Index:
    """Paths (of one namespace of names) arranged so that judging one costs a walk up its
    ancestors and a binary search, not a pass over every rule."""

    def __init__(self) -> None:
        self.exact: dict[str, DenyRule] = {}
        self.inside: dict[str, DenyRule] = {}
        self.ordered: list[str] = []

    def add(self, path: str, rule: DenyRule) -> None:
        self.exact.setdefault(path, rule)  # the first rule for a path wins
        if rule.inside:
            self.inside.setdefault(path, rule)

    def seal(self) -> None:
        self.ordered = sorted(self.exact)

    def violated(self, path: str) -> tuple[DenyRule, str] | None:
        if path in self.exact:
            return self.exact[path], "is or contains"
        prefix = path.rstrip("/") + "/"
        at = bisect.bisect_left(self.ordered, prefix)
        if at < len(self.ordered) and self.ordered[at].startswith(prefix):
            return self.exact[self.ordered[at]], "is or contains"
        ancestor = path
        while ancestor != "/":
            ancestor = _parent(ancestor)
            if ancestor in self.inside:
                return self.inside[ancestor], "lies inside"
        return None


class Judge:
    """The rules, resolved and placed now, and indexed twice: by host path (a source that
    contains a denied mount point is caught there) and by place in a file system (a
    bind-mount view is caught there); then by file identity (a hardlink)."""

    def __init__(self, rules: Sequence[DenyRule]) -> None:
        self.places = _Places()
        self.by_path = _Index()
        self.by_place: dict[str, _Index] = {}
        self.identities: dict[tuple[int, int], DenyRule] = {}
        self.denied_dirs: list[tuple[DenyRule, str]] = []  # looked through for hardlinks
        self.linked: dict[tuple[int, int], tuple[DenyRule, str]] | None = None  # made lazily
        self.everything: DenyRule | None = None
        self.linked_files: list[tuple[DenyRule, str, os.stat_result]] = []
        resolved_dirs: dict[str, str] = {}
        for rule in rules:
            if not rule.path.startswith("/"):
                continue  # a profile's rule naming an unset variable: it names no host path
            if rule.mask:
                continue  # judged where each bind shows it: _refuse_shown_masks
            resolved, info = _resolve_with(rule.path, resolved_dirs)
            if resolved == "/":
                self.everything = rule
            self.by_path.add(resolved, rule)
            device, place = self.places.of(resolved)
            self.by_place.setdefault(device, _Index()).add(place, rule)
            if info is not None:
                self.identities.setdefault((info.st_dev, info.st_ino), rule)
                if rule.inside and stat.S_ISDIR(info.st_mode) and not rule.records:
                    self.denied_dirs.append((rule, resolved))
                elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                    self.linked_files.append((rule, resolved, info))
        self.by_path.seal()
        for index in self.by_place.values():
            index.seal()

    def violated(self, source: str) -> tuple[DenyRule, str] | None:
        """The rule a bind of the (resolved) source would break, and how; or None."""
        found = self.violated_by_path(source)
        if found is not None:
            return found
        try:
            info = os.stat(source)
        except OSError:
            return None
        return self.violated_by_file(source, info)

    def violated_by_path(self, source: str) -> tuple[DenyRule, str] | None:
        """The rule the (resolved) source breaks by its path or its place in a file system."""
        if self.everything is not None:
            return self.everything, "lies inside"
        found = self.by_path.violated(source)
        if found is not None:
            return found
        device, place = self.places.of(source)
        index = self.by_place.get(device)
        return index.violated(place) if index is not None else None

    def violated_by_file(self, source: str, info: os.stat_result) -> tuple[DenyRule, str] | None:
        """The rule the (resolved) source breaks as the file it is, info its stat: a denied
        file's other name, a directory that holds one or shows a denied mount."""
        rule = self.identities.get((info.st_dev, info.st_ino))
        if rule is not None:
            return rule, "is (the same file as)"
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            named = self._linked().get((info.st_dev, info.st_ino))
            if named is not None:
                return named[0], f"is another name (a hardlink) of {printable(named[1])}, in"
        if stat.S_ISDIR(info.st_mode):
            return self._mounted_below(source) or self._linked_below(source, info.st_dev)
        return None

    def _mounted_below(self, source: str) -> tuple[DenyRule, str] | None:
        """A host mount below source that shows a denied place (bwrap binds recursively, so a
        bind-mount view of ~/.ssh inside a bound directory would come along)."""
        prefix = source.rstrip("/") + "/"
        for point, device, root in self.places.mounts:
            index = self.by_place.get(device)
            if index is not None and point.startswith(prefix):
                found = index.violated(root)
                if found is not None:
                    return found[0], f"holds a mount ({printable(point)}) of"
        return None

    def _linked(self) -> dict[tuple[int, int], tuple[DenyRule, str]]:
        """Denied files with more than one name: named by a rule, or in a denied directory
        (LINKED_DEPTH deep, LINKED_SCAN entries in all). Looked for once per check."""
        if self.linked is None:
            self.linked = {}
            # Every name found of each, in the rules and the denied directories, by its place
            # in its file system: one seen through two views of a directory is one name.
            names: dict[tuple[int, int], set[tuple[str, str]]] = {}
            for rule, path, info in self.linked_files:
                self.linked[(info.st_dev, info.st_ino)] = (rule, path)
                names[(info.st_dev, info.st_ino)] = {self.places.of(path)}
            budget = LINKED_SCAN
            for rule, directory in self.denied_dirs:
                try:
                    found, budget = _syscalls.linked_files(directory, LINKED_DEPTH, budget)
                except OSError:
                    continue
                for device, inode, path in found:
                    self.linked.setdefault((device, inode), (rule, path))
                    names.setdefault((device, inode), set()).add(self.places.of(path))
            for identity, places in names.items():
                if _every_name(identity, places, self.linked[identity][1]):
                    del self.linked[identity]
        return self.linked

    def _linked_below(self, source: str, device: int) -> tuple[DenyRule, str] | None:
        """The denied file with several names of which source holds one, looked for only when
        such a file lies on source's file system; a directory too large to look through is
        refused, as it could hold one."""
        wanted = {
            identity: named for identity, named in self._linked().items() if identity[0] == device
        }
        if not wanted:
            return None
        from nsconfine._kernel.walk import walk

        seen = 0
        for root, dirs, files in walk(source, on_error=lambda _error: None):
            for name in files:
                path = os.path.join(root, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                named = wanted.get((info.st_dev, info.st_ino))
                if named is not None:
                    return named[
                        0
                    ], f"holds {printable(path)}, another name of {printable(named[1])}, in"
            seen += len(files) + len(dirs)
            if seen > BOUND_SCAN:
                rule, key = next(iter(wanted.values()))
                return rule, (
                    f"is too large to look through for another name of {printable(key)} (it "
                    "has several on this file system: `find / -xdev -samefile "
                    f"{printable(key)}` lists them; remove those not needed), in"
                )
        return None


def _every_name(identity: tuple[int, int], places: set[tuple[str, str]], path: str) -> bool:
    """Are places (found in denied directories, each a name's place in its file system) every
    name the file at path has? Then it has none elsewhere that a bind could show (a session's
    own link in its workspace, denied to another session: both names are in that workspace)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == identity and info.st_nlink <= len(places)


def _resolve_with(path: str, memo: dict[str, str]) -> tuple[str, os.stat_result | None]:
    """path resolved as resolve() does, and its stat if it exists; memo holds the resolved
    parents of missing paths (many rules share a home) for the length of one check."""
    try:
        resolved = _syscalls.realpath(path)
    except OSError:
        return _resolve_missing(path, memo), None
    try:
        return resolved, os.stat(resolved)
    except OSError:
        return resolved, None


# The host's procfs holds every process's environment, command line and memory maps (the
# launcher's own among them, at /proc/self); its /dev, the host's devices and shared memory.
# The sandbox has its own of each. Only the system's read-only covers of /proc's writable parts
# (nsconfine._plan.system) are bound from the host's, each over itself.
_KERNEL_FILE_SYSTEMS = {
    "/proc": "every process's environment and memory, the launcher's own among them",
    "/dev": "the host's devices and shared memory",
}
_SUB_MOUNTS = ("/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/hugepages")


def _kernel_file_systems() -> dict[int, str]:
    """Device number -> which of the host's /proc or /dev it is (a bind of either elsewhere
    keeps its device). A symlink is no mount (a /dev/shm that links to /run/shm, or to a
    directory of the root file system, would make every bind of that file system the host's
    /dev); /dev, where it lies, is counted anyway."""
    found: dict[int, str] = {}
    for path in (*_KERNEL_FILE_SYSTEMS, *_SUB_MOUNTS):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISLNK(info.st_mode):
            found.setdefault(info.st_dev, "/dev" if path != "/proc" else "/proc")
    return found


def _refuse_host_proc_or_dev(
    entry: Entry, resolved: str, device: int, kernel_devices: Mapping[int, str]
) -> None:
    # Judged as resolved, and as written: /proc/self/cwd resolves to the launcher's directory,
    # and a destination in /proc lies in the sandbox's own, which changes with each process.
    top = kernel_devices.get(device)
    if top is None:  # (a loop, not any() of a generator: a launch judges ~50 binds)
        for named in _KERNEL_FILE_SYSTEMS:
            if within(resolved, named) or within(entry.source, named) or within(entry.dest, named):
                top = named
                break
        else:
            return
    from nsconfine._plan.system import PROC_READ_ONLY

    if (
        top == "/proc"
        and entry.kind is Kind.BIND
        and entry.mode is Mode.RO
        and entry.source == entry.dest == resolved
        and any(resolved == path for path, _ in PROC_READ_ONLY)
    ):
        return
    raise PlanError(
        f"{printable(entry.source)} (for {printable(entry.dest)}) is in the host's {top} "
        f"({_KERNEL_FILE_SYSTEMS[top]}): no session binds it; the sandbox has a {top} of its own"
    )


def _refuse_a_host_endpoint(entry: Entry, info: os.stat_result) -> None:
    """A socket bound in any mode is a way to whoever serves it on the host: only the tool
    socket, which says so, may be one. A read-only bind stops no one writing into a FIFO or a
    device either (a writable one says it is written)."""
    mode = info.st_mode
    if stat.S_ISSOCK(mode) and entry.reason == TOOL_SOCKET_REASON:
        return
    written = stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
    if stat.S_ISSOCK(mode) or (written and entry.mode is Mode.RO):
        raise PlanError(
            f"{printable(entry.source)} (for {printable(entry.dest)}) is {file_kind(mode)}: no "
            "bind stops a session connecting to a socket, nor a read-only one writing through a "
            "FIFO or a device, to whoever serves or reads it on the host; a socket the session "
            "calls is given with --tool-socket (Session(tool_socket=...)), which says so; drop "
            "this bind"
        )


def check_plan(
    plan: Plan, rules: Sequence[DenyRule] | None = None
) -> dict[str, tuple[int, int] | None]:
    """Refuse the plan (PlanError) if any bind's source is missing, is `/`, breaks a rule (of
    rules: plan.deny if None), or would make writable what another entry binds read-only.
    Returns what it judged: each source's (device, inode), None for a stub not made yet; the
    launch checks the files it opens against it."""
    _refuse_a_working_directory_nowhere(plan)
    judge = Judge(plan.deny if rules is None else rules)
    kernel_devices = _kernel_file_systems()
    judged: dict[str, tuple[int, int] | None] = {}
    writable: list[tuple[Entry, tuple[str, str]]] = []
    read_only: list[tuple[Entry, tuple[str, str]]] = []
    binds: list[tuple[Entry, str]] = []  # each host bind and its resolved source
    for entry in plan.entries:
        if not entry.is_host_bind:
            continue
        try:
            resolved = _syscalls.realpath(entry.source)
        except OSError as error:
            if entry.stub is not None and error.errno == errno.ENOENT:
                judged[entry.source] = None  # made empty at launch: nothing to judge yet
                continue
            raise PlanError(
                f"{printable(entry.source)} (for {printable(entry.dest)}) cannot be bound: "
                f"{os.strerror(error.errno or 0)}; create it or drop it from the session"
            ) from error
        if resolved == "/":
            raise PlanError(
                f"{printable(entry.source)} resolves to / and would expose the whole host"
            )
        try:
            info: os.stat_result | None = os.stat(resolved)
        except OSError:
            info = None
        identity = None if info is None else (info.st_dev, info.st_ino)
        device = -1 if info is None else info.st_dev
        _refuse_host_proc_or_dev(entry, resolved, device, kernel_devices)
        if info is not None and entry.kind is Kind.BIND:
            _refuse_a_host_endpoint(entry, info)
        found = judge.violated_by_path(resolved)
        if found is None and info is not None:  # (stat just taken: not taken again)
            found = judge.violated_by_file(resolved, info)
        if found is not None:
            rule, relation = found
            shown = printable(entry.source)
            if resolved != entry.source:
                shown += f" (-> {printable(resolved)})"
            raise PlanError(
                f"{shown} {relation} {printable(rule.path)} ({rule.reason}; from "
                f"{rule.origin}); no session may see it: bind a narrower path that holds no "
                "secrets"
            )
        judged[entry.source] = identity
        binds.append((entry, resolved))
        place = judge.places.of(resolved)
        if entry.kind is Kind.BIND and entry.mode is Mode.RW:
            writable.append((entry, place))
        else:
            read_only.append((entry, place))
    _refuse_writable_aliases(writable, read_only)
    _refuse_audit_in_writable(plan, judge.places, writable)
    _refuse_symlinks_in_writable(plan, {entry.source: real for entry, real in binds}, judge.places)
    _refuse_shown_masks(plan, judge.places, binds)
    return judged


def _refuse_a_working_directory_nowhere(plan: Plan) -> None:
    """PlanError unless plan.chdir is a directory the session can enter in its sandbox:
    bwrap alone refused it, and the launch was told as one bwrap could not set up."""
    try:
        enters = _a_bind_of_itself(plan, plan.chdir) or _enters(plan, plan.chdir)
    except ValueError:  # (a NUL, a lone surrogate: no path the kernel takes)
        enters = False
    if not enters:
        raise PlanError(
            f"the working directory {printable(plan.chdir)} is no directory the session's "
            "account can enter in the sandbox: give one the plan shows (the workspace, a "
            "directory in a bind), by its real path"
        )


def _a_bind_of_itself(plan: Plan, path: str) -> bool:
    """Is path, in one look (the common case, a session's workspace), the place of a bind of
    itself that no bind above holds (bwrap makes the directories above it, in the root's or a
    tmpfs's), a directory the session's account may search? False says nothing: _enters walks
    it."""
    at = None
    for entry in plan.entries:
        if entry.dest == path:
            at = entry
        elif entry.kind is Kind.BIND and inside(path, entry.dest) is not None:
            return False
    if at is None or at.kind is not Kind.BIND or at.source != path:
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and _searchable(plan, path, info)


def _searchable(plan: Plan, path: str, info: os.stat_result) -> bool:
    """May the session's account search path (info: its stat)? Another account's by the mode
    bits; the launcher's own as the kernel says (its sessions' too)."""
    if plan.user.uid != os.geteuid():
        return allows(info, plan.user, SEARCH)
    return os.access(path, os.X_OK, effective_ids=True)


def _enters(plan: Plan, path: str) -> bool:
    """Does path lead to a directory in plan's sandbox as it starts, walked name by name as
    the kernel walks it (`..` from where the walk is; each symlink met, one the plan makes
    or one in a bind's source, followed from there, at most as many as the kernel follows),
    every directory on the way one the session's account may search?"""

    def look(here: str) -> str | bool | None:
        found = _what_is_at(plan, here)
        return None if found is True else found  # a directory it may search: walked into

    # (The kernel's walk may count a path's links again when it starts the walk over, out of
    # its lockless mode, as files change beside it: CI's runs saw bwrap's chdir refuse chains
    # of 30 and 40 links, rarely, as too many; past the bound it always does.)
    return walk_path(path, look, past_the_bound=False)[0] is None


def _what_is_at(plan: Plan, place: str) -> bool | str:
    """What the session finds at place (a path with no symlink above it) as its sandbox
    starts: a symlink's target; True for a directory it may search; False for anything else
    (nothing, a file, a directory it may not search)."""
    holder = None  # the last of the deepest entries whose place holds place
    made_above = False  # bwrap makes the directories above an entry's place
    for entry in plan.entries:
        if entry.kind is Kind.REMOUNT_RO:
            continue
        if inside(entry.dest, place) is not None:
            made_above = True
        elif within(place, entry.dest) and (holder is None or len(entry.dest) >= len(holder.dest)):
            holder = entry
    if holder is None:
        return made_above
    below = inside(place, holder.dest)
    if holder.kind is Kind.SYMLINK:
        return holder.source if below is None and holder.source else False
    if holder.kind is Kind.BIND:
        assert holder.source is not None
        host = holder.source if below is None else f"{holder.source}/{below}"
        try:
            info = os.stat(host) if below is None else os.lstat(host)  # (a source as bound)
            if stat.S_ISLNK(info.st_mode):
                return os.readlink(host)
        except OSError:
            return made_above  # (a mount point the launch makes there)
        return stat.S_ISDIR(info.st_mode) and _searchable(plan, host, info)
    if holder.kind is Kind.PROC:
        return True  # (the kernel's: its own pid namespace's)
    return made_above or (
        below is None and holder.kind in (Kind.TMPFS, Kind.DIR, Kind.DEV, Kind.DEVPTS)
    )


def _refuse_shown_masks(plan: Plan, places: _Places, shown: Sequence[tuple[Entry, str]]) -> None:
    """Every masked path is a symlink to none, has one name (or, a directory, holds no file
    with another), and is shown by no bind but where the plan covers it: a bind that is it or
    lies inside it is refused, and one that holds it (by path, or by place: a bind-mount view)
    must have a cover at the very place it shows it."""
    if not any(rule.mask for rule in plan.deny):
        return
    from nsconfine._plan.mask import is_cover, masked_path, refuse_other_names
    from nsconfine._text import inside

    remounted = {entry.dest for entry in plan.entries if entry.kind is Kind.REMOUNT_RO}
    covered = {entry.dest for entry in plan.entries if is_cover(entry, remounted)}
    for rule in plan.deny:
        if not rule.mask:
            continue
        path = masked_path(rule.path)
        refuse_other_names(path)
        device, place = places.of(path)
        for entry, source in shown:
            source_device, source_place = places.of(source)
            same_file_system = source_device == device
            if within(source, path) or (same_file_system and within(source_place, place)):
                raise PlanError(
                    f"{printable(entry.source)} (for {printable(entry.dest)}) shows "
                    f"{printable(rule.path)}, which is masked ({printable(rule.reason)}; from "
                    f"{rule.origin}): no bind may show it but where the mask covers it; drop "
                    "the bind or the mask"
                )
            below = inside(path, source)
            if below is None and same_file_system:
                below = inside(place, source_place)
            if below is None:
                continue
            there = os.path.normpath(f"{entry.dest}/{below}")
            if there not in covered:
                raise PlanError(
                    f"{printable(entry.source)} (for {printable(entry.dest)}) shows the masked "
                    f"{printable(rule.path)} at {printable(there)}, where the plan does not "
                    "cover it: mask it there too (or bind a narrower path)"
                )


def _refuse_audit_in_writable(
    plan: Plan, places: _Places, writable: Sequence[tuple[Entry, tuple[str, str]]]
) -> None:
    """The audit file is opened and appended to by the launcher (as root, by root): it must
    not lie where the session writes, which could put a symlink above it (the launcher would
    create and write the file wherever that leads) or a FIFO in its place (the launch would
    wait on it)."""
    if plan.audit is not None:
        _refuse_inside_writable(
            plan.audit,
            "the audit file",
            "it could put a symlink or a FIFO there for the launcher to follow or wait on; keep "
            "the audit file outside the workspace and run directory",
            places,
            writable,
        )
        # Anyone else who may change its directory (a session's account, another session's)
        # could lead the launcher to create, or append to, a file of their choosing.
        judged = plan.audit if os.path.lexists(plan.audit) else os.path.dirname(plan.audit)
        if not os.path.lexists(judged):
            raise PlanError(
                f"the audit file {printable(plan.audit)} cannot be made: its directory "
                f"{printable(judged)} does not exist; make it, writable only by root or you"
            )
        reason = untrusted_reason(judged)
        if reason is not None:
            raise PlanError(
                f"the audit file {printable(plan.audit)} lies where someone other than root or "
                f"you can change it ({printable(reason)}), a session's account among them: they "
                "could lead the launcher to create or append to a file of their choosing; keep "
                "it in a directory only root or you can write"
            )


def refuse_profiles_a_session_could_write(plan: Plan, profiles: Sequence[str]) -> None:
    """The profile files plan was made from (each, and each it includes) must not lie where
    the session writes: a session that rewrote its own profile would choose what its next
    launch is given (binds, the network, the launcher's variables). Who else could change
    them was judged as they were read (profiles._refuse_untrusted)."""
    if not profiles:
        return
    places = _Places()
    writable = [
        (entry, places.of(resolve(entry.source)))
        for entry in plan.entries
        if entry.kind is Kind.BIND and entry.mode is Mode.RW
    ]
    for profile in profiles:
        _refuse_inside_writable(
            profile,
            "the profile",
            "it could rewrite what its next launch is given; keep profiles outside the "
            "workspace and run directory",
            places,
            writable,
        )


def _refuse_inside_writable(
    path: str,
    what: str,
    why: str,
    places: _Places,
    writable: Sequence[tuple[Entry, tuple[str, str]]],
) -> None:
    """Refuse path, a file the launcher opens, if it lies inside a writable bind: by path as
    written or resolved, or by place (a bind-mount view of it)."""
    written = os.path.abspath(path)
    resolved = resolve(written)  # (a symlink the session put inside leads out: as written too)
    device, place = places.of(resolved)
    for entry, (rw_device, rw_place) in writable:
        source = os.path.abspath(entry.source)
        if (
            within(written, source)
            or within(written, resolve(source))
            or within(resolved, resolve(source))
            or (rw_device == device and within(place, rw_place))
        ):
            raise PlanError(
                f"{what} {printable(path)} lies inside the writable bind "
                f"{printable(entry.source)}, which the session can write: {why}"
            )


def _refuse_symlinks_in_writable(plan: Plan, resolved: Mapping[str, str], places: _Places) -> None:
    """A source that lies inside a writable bind must be reached without a symlink below
    that bind: the session may have planted one there, to lead a later read-only bind (or a
    runner file) to any file its account can read. And a writable bind, or the workspace in
    any mode, must not be a symlink nor be reached through one a session could have made (a
    session may have put one where the broker will put the next workspace). resolved:
    sources this check has just resolved, each to its real path; places: where paths lie
    in their file systems (a bind-mount view of a writable bind is one with it)."""

    def real(source: str) -> str:
        return resolved.get(source) or _syscalls.realpath(source)

    tops = [
        (entry.source.rstrip("/"), real(entry.source))
        for entry in plan.entries
        if entry.kind is Kind.BIND and entry.mode is Mode.RW and os.path.exists(entry.source)
    ]
    for entry in plan.entries:
        the_brokers = entry.mode is Mode.RW or entry.dest == plan.chdir  # (its workspace)
        if entry.kind is Kind.BIND and the_brokers:
            if os.path.islink(entry.source):
                target = printable(os.readlink(entry.source))
                raise PlanError(
                    f"{printable(entry.source)} is a symlink (to {target}): a writable bind is "
                    "given by its real path, so that no session can plant one where the next "
                    "workspace goes"
                )
            _refuse_planted_on_the_way(entry.source, plan.user)
        if not entry.is_host_bind:
            continue
        if entry.source not in resolved and not os.path.lexists(entry.source):
            continue
        below = [(top, real_top) for top, real_top in tops if entry.source.startswith(top + "/")]
        for top, resolved_top in below:
            expected = resolved_top.rstrip("/") + entry.source[len(top) :]
            try:
                actual = real(entry.source)
            except OSError:  # a symlink to nothing
                actual = ""
            if actual != expected:
                raise PlanError(
                    f"{printable(entry.source)} runs through a symlink inside the writable bind "
                    f"{printable(top)}: a session may have planted it to lead this bind "
                    "elsewhere; remove the symlink, or give the file's real path"
                )
        if not below and resolved.get(entry.source, entry.source) != entry.source:
            _refuse_a_way_through_writable(entry.source, tops, places)


def _refuse_a_way_through_writable(
    source: str, tops: Sequence[tuple[str, str]], places: _Places
) -> None:
    """PlanError if a symlink met resolving source lies inside a writable bind (tops: each
    one's path and real path), by its path or by where it lies in its file system (a view
    of the workspace the host bind-mounted elsewhere): a source named through a link outside
    the workspace (the host's alias -> ws), or such a view, and on through one inside it
    (ws/tools), which a session re-points to lead the next launch's bind to any file its
    account can read."""
    looked, _end = _syscalls.lookups("/", source)
    for path in looked:  # each one's directory a real path
        if not os.path.islink(path):
            continue
        device, place = places.of(os.path.dirname(path))
        for top, real_top in tops:
            top_device, top_place = places.of(real_top)
            if within(os.path.dirname(path), real_top) or (
                device == top_device and within(place, top_place)
            ):
                raise PlanError(
                    f"{printable(source)} runs through {printable(path)}, a symlink inside the "
                    f"writable bind {printable(top)}: a session may have planted it to lead "
                    "this bind elsewhere; remove the symlink, or give the file's real path"
                )


def _refuse_planted_on_the_way(source: str, user: RunAs) -> None:
    """A writable bind named through a symlink above it: refused unless no session could have
    made that symlink (accounts.refuse_planted_link)."""
    looked, real = _syscalls.lookups("/", source)
    for path in looked:
        try:
            info = os.lstat(path)
            holder = os.lstat(os.path.dirname(path))
        except OSError:
            return  # the way ends here: the source is judged missing elsewhere
        if stat.S_ISLNK(info.st_mode):
            refuse_planted_link(source, path, info, holder, user, real)


def _refuse_writable_aliases(
    writable: Sequence[tuple[Entry, tuple[str, str]]],
    read_only: Sequence[tuple[Entry, tuple[str, str]]],
) -> None:
    """A file the plan binds read-only must not also be reachable through a writable bind at
    another place in the sandbox (a symlink a session planted where the next workspace goes
    leads exactly there). At its own place, a read-only bind inside a writable one (a runner
    file in the workspace) covers it, and is fine."""
    for rw, (device, place) in writable:
        for ro, (ro_device, ro_place) in read_only:
            if ro_device != device or not within(ro_place, place):
                continue
            there = os.path.normpath(rw.dest + "/" + ro_place[len(place) :].lstrip("/"))
            if there != ro.dest:
                raise PlanError(
                    f"{printable(ro.source)} is bound read-only at {printable(ro.dest)}, but the "
                    f"writable bind of {printable(rw.source)} shows it at {printable(there)} as "
                    "well: the session could change it there; keep read-only files out of "
                    "writable directories, and check for symlinks a session planted"
                )
