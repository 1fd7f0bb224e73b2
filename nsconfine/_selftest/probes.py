"""The selftest's probes, as data: what a session tries in the stand-in world, whether it must
be allowed, how the host judges it, and the change that must flip it.

Each probe runs in a fresh confined session and is judged by the host's own truth: a read is
allowed only if the session printed the file's real content, a write only if the host file
changed. The test suite runs the same probes on weakened plans too (each probe says how to
weaken the plan so that it must flip), which shows that no probe can pass on an unconfined
session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from nsconfine._kernel import layers as _layers
from nsconfine._plan import model as p
from nsconfine._plan.allowlist import Destination
from nsconfine._plan.model import Plan
from nsconfine._selftest.world import World


@dataclass(frozen=True)
class Outcome:
    """What a probe's session did: its exit status and output."""

    status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Probe:
    """One thing a session tries, whether it must be allowed, how the host judges it, and the
    change that must flip it: to the plan (bind what it must not see, or drop what it needs)
    or, for what a kernel layer refuses, that layer switched off (the door in
    nsconfine._kernel.layers)."""

    name: str
    expect_allowed: bool
    script: str
    judge: Callable[[Outcome], bool]  # True when the host shows the action took effect
    weaken: Callable[[Plan], Plan]
    layers_off: tuple[str, ...] = ()
    before: str = ""  # run first, in a launch of the same plan: what a session leaves behind
    proxied: bool = False  # runs in the world's proxy session (World.plan_for)


def plan_for(world: World, probe: Probe) -> Plan:
    """The plan probe runs on: the world's coder session, or its proxy session."""
    return world.proxy_plan() if probe.proxied else world.plan()


# Searches everything a session can read for a secret, given reversed (so that the search's own
# argv holds no copy): its environment, every process's environ, cmdline and memory (but its
# own, which holds the needle once reversed back), and its files. Prints "found: [...]".
SECRET_SEARCH = r"""
import os, sys
secret = sys.argv[1][::-1].encode()
found, searched = [], 0
for name, value in os.environ.items():
    if secret in value.encode():
        found.append("environment " + name)
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                if secret in f.read():
                    found.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
    if int(pid) == os.getpid():
        continue
    try:
        with open(f"/proc/{pid}/maps") as f:
            regions = [line.split()[:2] for line in f]
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        continue
    searched += 1
    for span, perms in regions:
        start, end = (int(x, 16) for x in span.split("-"))
        if perms[0] != "r" or end - start > 256 << 20:
            continue
        try:
            if secret in os.pread(mem, end - start, start):
                found.append(f"/proc/{pid}/mem")
                break
        except OSError:
            pass
    os.close(mem)
for top in ("/tmp", os.environ.get("HOME", "/"), os.getcwd(), "/run", "/etc"):
    for root, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    if secret in f.read(1 << 20):
                        found.append(os.path.join(root, name))
            except OSError:
                pass
print("memory of", searched, "processes searched", file=sys.stderr)
print("found:", sorted(set(found)))
"""


def host_text(path: str) -> str | None:
    """A host file's text as the launcher reads it (None if it cannot): the truth a probe is
    judged by."""
    try:
        with open(path, errors="replace") as file:
            return file.read()
    except OSError:
        return None


def shell_quoted(path: str) -> str:
    """path as one word of a probe's shell script."""
    return "'" + path.replace("'", "'\\''") + "'"


def _add(*entries: p.Entry) -> Callable[[Plan], Plan]:
    def weaken(plan: Plan) -> Plan:
        replaced = {entry.dest for entry in entries}
        kept = [entry for entry in plan.entries if entry.dest not in replaced]
        return plan.replace(entries=(*kept, *entries))  # the plan puts them in order

    return weaken


def _host_network(plan: Plan) -> Plan:
    return plan.replace(network="host", network_reason="weakened: the launcher's network")


def _drop(dest: str, chdir: str | None = None) -> Callable[[Plan], Plan]:
    def weaken(plan: Plan) -> Plan:
        weaker = plan.without(dest)
        return weaker.replace(chdir=chdir) if chdir else weaker

    return weaken


def probes(world: World) -> list[Probe]:
    """Every check, refusals first; each one judged from the host."""
    probes = [_read_probe(world, name, path) for name, path in world.secrets.items()]
    probes += _write_refusals(world)
    probes += _process_and_fd_refusals(world)
    probes += _network_refusals(world)
    probes += _host_power_refusals(world)
    probes += _trusted_file_refusals(world)
    probes += _layer_refusals(world)
    probes += _needs(world)
    return probes


def _filtered(name: str, script: str, done: str) -> Probe:
    """A probe of what the seccomp filter refuses: the Python script prints done (a word no
    refusal prints) when the session got it done."""
    return Probe(
        name,
        False,
        f"python3 -c {shell_quoted(script)}",
        lambda outcome: done in outcome.stdout,
        lambda plan: plan,
        layers_off=("seccomp",),
    )


def _layer_refusals(world: World) -> list[Probe]:
    """A probe per kernel layer this host has, each judged by what the session got done."""
    keyring = (
        "import ctypes; libc = ctypes.CDLL(None); "
        "print('made' if libc.syscall(250, 0, -3, 1) > 0 else 'refused')"  # keyctl
    )
    families = (
        "import socket\nfor f in ('AF_VSOCK', 'AF_ALG', 'AF_TIPC', 'AF_RDS', 'AF_CAN', "
        "'AF_PACKET', 'AF_BLUETOOTH'):\n    family = getattr(socket, f, None)\n"
        "    for kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_STREAM):\n"
        "        try:\n            socket.socket(family, kind).close(); print('opened', f)\n"
        "        except (OSError, TypeError):\n            pass"
    )
    semaphores = (  # semget(IPC_PRIVATE, 250, IPC_CREAT | 0600) until refused, 200 at most
        "import ctypes; libc = ctypes.CDLL(None); made = 0\n"
        "while made < 200 and libc.semget(0, 250, 0o1600) >= 0:\n    made += 1\n"
        "print(made)"
    )
    host_counts = (  # each once: what one session could repeat until the host has none left
        "import ctypes, socket; libc = ctypes.CDLL(None)\n"
        "class Program(ctypes.Structure):\n"
        "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
        "def program(k):  # BPF_RET | BPF_K, k\n"
        "    one = (ctypes.c_uint64 * 1)(k << 32 | 6)\n"
        "    return one, Program(1, ctypes.addressof(one))\n"
        "accept, socket_filter = program(0xFFFF)\n"
        "unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "if libc.setsockopt(unix.fileno(), 1, 26, ctypes.byref(socket_filter), 16) == 0:\n"
        "    print('took a socket filter')\n"
        "libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS\n"
        "allow, seccomp_filter = program(0x7FFF0000)  # SECCOMP_RET_ALLOW\n"
        "if libc.prctl(22, 2, ctypes.byref(seccomp_filter), 0, 0) == 0:\n"
        "    print('took a seccomp filter')\n"
        "context = ctypes.c_ulong(0)\n"
        "if libc.syscall(206, 1, ctypes.byref(context)) == 0: print('took Linux AIO')\n"
        "try:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close(); print('took UDP')\n"
        "except OSError:\n    pass"
    )
    probes = [
        _filtered(
            "take host-wide counts: JIT (socket, seccomp filters), AIO, UDP", host_counts, "took"
        ),
        _filtered("make keys with the keyring syscalls", keyring, "made"),
        _filtered("open a socket family past UNIX, INET and NETLINK", families, "opened"),
        Probe(
            "make a nested user namespace",
            False,
            "unshare -U true && echo made",
            lambda outcome: outcome.stdout.strip() == "made",
            lambda plan: plan,
            layers_off=("no-nested-userns",),
        ),
        Probe(  # kernel memory no process is charged for; bounded, the twin takes ~3 MiB
            "hold the host's memory in System V semaphores (200 sets of 250)",
            False,
            f"python3 -c {shell_quoted(semaphores)}",
            lambda outcome: outcome.stdout.strip() == "200",
            _drop("/dev/pts"),  # the devpts is the limits step's too
            layers_off=("session-limits",),
        ),
    ]
    if os.uname().machine == "x86_64":
        read_ldt = (  # modify_ldt(0, buffer, 16): reads this process's LDT
            "import ctypes; libc = ctypes.CDLL(None); ldt = ctypes.create_string_buffer(16)\n"
            "print('read' if libc.syscall(154, 0, ldt, 16) >= 0 else 'refused')"
        )
        probes.append(
            Probe(
                "reach the LDT (modify_ldt)",
                False,
                f"python3 -c {shell_quoted(read_ldt)}",
                lambda outcome: outcome.stdout.strip() == "read",
                lambda plan: plan,
                layers_off=("seccomp",),
            )
        )
    scopes = _layers.landlock_abi() >= _layers.LANDLOCK_SCOPES_ABI
    connect = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX)\ntry:\n"
        "    s.connect('\\0' + sys.argv[1]); print('connected')\n"
        "except OSError:\n    print('refused')"
    )
    # Both the session's own network namespace and Landlock's scope keep it out.
    probes.append(
        Probe(
            "connect to a host abstract socket",
            False,
            f"python3 -c {shell_quoted(connect)} {world.abstract_name}",
            lambda outcome: outcome.stdout.strip() == "connected",
            _host_network,
            layers_off=("landlock",) if scopes else (),
        )
    )
    if scopes:
        pid_1 = (
            "import ctypes, os; libc = ctypes.CDLL(None)\n"
            "try:\n    os.close(os.open('/proc/1/mem', os.O_RDWR)); print('reached')\n"
            "except OSError:\n    print('refused')"
        )
        probes += [
            Probe(
                "write the memory of the sandbox's pid 1",
                False,
                f"python3 -c {shell_quoted(pid_1)}",
                lambda outcome: outcome.stdout.strip() == "reached",
                lambda plan: plan,
                layers_off=("landlock",),
            ),
        ]
    return probes


def _trusted_file_refusals(world: World) -> list[Probe]:
    envrc = os.path.join(world.workspace, ".envrc")
    git_dir = os.path.dirname(world.git_config)

    def unprotected(*dests: str) -> Callable[[Plan], Plan]:
        return lambda plan: plan.replace(
            entries=tuple(e for e in plan.entries if e.dest not in dests)
        )

    nested = os.path.dirname(world.nested_git)
    made = os.path.join(world.workspace, "made-later")
    plant = "printf '\\tfsmonitor = touch /tmp/pwned\\n' >> {}; true"

    def writes_fsmonitor(path: str) -> Callable[[Outcome], bool]:
        return lambda outcome: "fsmonitor" in (host_text(path) or "")

    return [
        Probe(
            "hide a repository's HEAD, then write its config at the next launch",
            False,
            f"{plant.format(shell_quoted(world.nested_git + '/config'))}; "
            f"mv {shell_quoted(nested)}/HEAD.away {shell_quoted(world.nested_git)}/HEAD",
            writes_fsmonitor(world.nested_git + "/config"),
            unprotected(world.nested_git + "/config", world.nested_git),
            before=f"mv {shell_quoted(world.nested_git)}/HEAD {shell_quoted(nested)}/HEAD.away",
        ),
        Probe(
            "make a repository, then write its config at the next launch of one plan",
            False,
            plant.format(shell_quoted(made + "/.git/config")),
            writes_fsmonitor(made + "/.git/config"),
            lambda plan: plan.replace(protection=None),  # not looked at again: stale
            before=f"mkdir -p {shell_quoted(made)}/.git/objects {shell_quoted(made)}/.git/refs && "
            f"echo 'ref: refs/heads/main' > {shell_quoted(made)}/.git/HEAD && "
            f": > {shell_quoted(made)}/.git/config",
        ),
        Probe(
            "rewrite .git/config, whose commands the host runs",
            False,
            f"cd {shell_quoted(world.workspace)}; "
            "printf '\tfsmonitor = touch /tmp/pwned\n' >> .git/config; "
            "mv .git .git.old && mkdir .git && echo '[core] fsmonitor = x' > .git/config; "
            "true",
            lambda outcome: "fsmonitor" in (host_text(world.git_config) or ""),
            unprotected(world.git_config, git_dir),
        ),
        Probe(
            "create an .envrc, which the host's shell runs",
            False,
            f"echo 'echo pwned' > {shell_quoted(envrc)}",
            lambda outcome: "pwned" in (host_text(envrc) or ""),
            unprotected(envrc),
        ),
    ]


def _host_power_refusals(world: World) -> list[Probe]:
    planted = os.path.join(world.workspace, f"setuid-{world.token}")
    plant = (
        f"cp /bin/sh {shell_quoted(planted)}-chmod; chmod 4755 {shell_quoted(planted)}-chmod; "
        "python3 -c 'import os, sys; os.umask(0); "
        "os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o6755))' "
        f"{shell_quoted(planted)}-open; true"
    )

    def kept_a_setid_bit(outcome: Outcome) -> bool:
        import stat

        for suffix in ("-chmod", "-open"):
            try:
                if os.lstat(planted + suffix).st_mode & (stat.S_ISUID | stat.S_ISGID):
                    return True
            except OSError:
                continue
        return False

    reader = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        "buf = ctypes.create_string_buffer(256); "
        "n = libc.syscall(250, 11, int(sys.argv[1]), buf, 256); "  # keyctl(KEYCTL_READ)
        "sys.stdout.write(buf.raw[:n].decode() if n > 0 else '')"
    )
    return [
        Probe(
            "open a sysctl for write",
            False,
            f"python3 -c {shell_quoted(_OPEN_SYSCTLS)}",
            lambda outcome: outcome.stdout.strip() not in ("", "0"),
            _drop("/proc/sys"),
        ),
        Probe(
            "read a key from the launcher's session keyring",
            False,
            f"python3 -c {shell_quoted(reader)} {world.key_serial}",
            lambda outcome: outcome.stdout == world.key_payload,
            lambda plan: plan,
            layers_off=("session-keyring", "seccomp"),  # the filter refuses keyctl too
        ),
        Probe(
            "plant a setuid file on the host",
            False,
            plant,
            kept_a_setid_bit,
            lambda plan: plan,
            layers_off=("seccomp",),
        ),
    ]


def _read_probe(world: World, name: str, path: str) -> Probe:
    truth = host_text(path)
    return Probe(
        f"read {name}",
        False,
        f"cat {shell_quoted(path)}",
        lambda outcome: outcome.status == 0 and outcome.stdout == truth,
        _add(p.ro_bind(path, path, "weakened: exposes a secret")),
    )


def _write_probe(
    world: World, name: str, path: str, weaken: Callable[[Plan], Plan], expect_allowed: bool = False
) -> Probe:
    mark = f"written {world.token} {len(name)}"

    def judge(outcome: Outcome) -> bool:
        return mark in (host_text(path) or "")

    return Probe(
        f"write {name}",
        expect_allowed,
        f"printf '%s\\n' '{mark}' >> {shell_quoted(path)}",
        judge,
        weaken,
    )


def _write_refusals(world: World) -> list[Probe]:
    other_ws = os.path.dirname(world.secrets["another session's workspace"])
    etc_file = f"/etc/nsconfine-probe-{world.token}"
    usr_file = f"/usr/nsconfine-probe-{world.token}"
    host_tmp = f"/tmp/nsconfine-probe-{world.token}"
    world.outside_marks += [etc_file, usr_file, host_tmp]
    in_sandbox = "weakened: the root stays writable"
    return [
        _write_probe(world, "/usr", usr_file, _add(p.rw_bind("/usr", "/usr", "weakened"))),
        Probe(
            "write /etc",
            False,
            f"echo x > {etc_file}",
            lambda outcome: outcome.status == 0 or os.path.exists(etc_file),
            _drop("/"),
        ),
        _write_probe(
            world,
            "the runner's file",
            world.runner_file,
            _add(p.rw_bind(world.runner_file, world.runner_file, "weakened")),
        ),
        _write_probe(
            world,
            "another session's workspace",
            os.path.join(other_ws, "planted"),
            _add(p.rw_bind(other_ws, other_ws, "weakened")),
        ),
        _write_probe(
            world,
            "the home",
            os.path.join(world.home, "planted"),
            _add(p.rw_bind(world.home, world.home, "weakened")),
        ),
        _write_probe(
            world, "the host's /tmp", host_tmp, _add(p.rw_bind("/tmp", "/tmp", in_sandbox))
        ),
    ]


def _network_refusals(world: World) -> list[Probe]:
    client = (
        "import socket, sys\ntry:\n"
        "    s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
        "    print(s.recv(100).decode(), end='')\nexcept OSError as e:\n    print(e)"
    )
    unlisted = f"unlisted.test:{world.loopback_port}"
    return [
        Probe(
            "reach a service on the host's loopback (the default network is none)",
            False,
            f"python3 -c {shell_quoted(client)} {world.loopback_port}",
            lambda outcome: outcome.stdout == f"loopback {world.token}",
            _host_network,
        ),
        Probe(
            "reach a host its allowlist does not name, through its proxy",
            False,
            f"python3 -c {shell_quoted(_TUNNEL)} {unlisted}",
            lambda outcome: f"loopback {world.token}" in outcome.stdout,
            lambda plan: plan.replace(
                destinations=(
                    *plan.destinations,
                    Destination.parse(f"{unlisted}=127.0.0.1", "weakened: listed"),
                )
            ),
            proxied=True,
        ),
        Probe(
            "find its API key in its environment, memory, files or /proc",
            False,
            f"python3 -c {shell_quoted(SECRET_SEARCH)} {shell_quoted(world.api_key[::-1])}",
            lambda outcome: "found: [" in outcome.stdout and "found: []" not in outcome.stdout,
            lambda plan: world.proxy_plan(inject=False),
            proxied=True,
        ),
    ]


def _process_and_fd_refusals(world: World) -> list[Probe]:
    marker = f"host-{world.token}"
    fd_truth = host_text(world.secrets["~/.ssh/id_ed25519"])
    return [
        Probe(
            "see host processes",
            False,
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
            lambda outcome: marker in outcome.stdout,
            _add(p.ro_bind("/proc", "/proc", "weakened: the host's /proc")),
        ),
        Probe(
            "use an fd the launcher leaked",
            False,
            f"cat /proc/self/fd/{world.leaked_fd}",
            lambda outcome: outcome.status == 0 and outcome.stdout == fd_truth,
            lambda plan: plan,
        ),  # the weakening is the launcher's, not the plan's
    ]


def _needs(world: World) -> list[Probe]:
    input_truth = host_text(os.path.join(world.workspace, "input.txt"))
    runner_truth = host_text(world.runner_file)
    home = os.path.join(world.run_dir, "home")
    client = (
        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "print(s.recv(100).decode(), end='')"
    )
    return [
        Probe(
            "read its workspace",
            True,
            "cat input.txt",
            lambda outcome: outcome.stdout == input_truth,
            _drop(world.workspace, chdir="/"),
        ),
        _write_probe(
            world,
            "its workspace",
            os.path.join(world.workspace, "out.txt"),
            _drop(world.workspace, chdir="/"),
            expect_allowed=True,
        ),
        _write_probe(
            world,
            "its run dir",
            os.path.join(world.run_dir, "state"),
            _drop(world.run_dir),
            expect_allowed=True,
        ),
        Probe(
            "write its empty HOME",
            True,
            'test -z "$(ls -A "$HOME")" && echo ok > "$HOME/made"',
            lambda outcome: host_text(os.path.join(home, "made")) == "ok\n",
            _drop(world.run_dir),
        ),
        Probe(
            "read the runner's file",
            True,
            f"cat {shell_quoted(world.runner_file)}",
            lambda outcome: outcome.stdout == runner_truth,
            _drop(world.runner_file),
        ),
        Probe(
            "run its pinned harness",
            True,
            shell_quoted(world.harness),
            lambda outcome: outcome.stdout == f"harness {world.token}\n",
            _drop(world.harness),
        ),
        Probe(
            "reach its tool socket",
            True,
            f"python3 -c {shell_quoted(client)} {shell_quoted(world.tool_socket)}",
            lambda outcome: outcome.stdout == f"pong {world.token}",
            _drop(world.tool_socket),
        ),
        Probe(
            "get its credential",
            True,
            'printf %s "$ANTHROPIC_API_KEY"',
            lambda outcome: outcome.stdout == world.api_key,
            lambda plan: plan.replace(
                env=tuple(v for v in plan.env if v.name != "ANTHROPIC_API_KEY")
            ),
        ),
        Probe(
            "call its API through its proxy, which adds the key it never holds",
            True,
            f"python3 -c {shell_quoted(_CALL_API)}",
            lambda outcome: outcome.stdout == f"api {world.token} key-ok",
            lambda plan: plan.replace(routes=()),
            proxied=True,
        ),
        Probe(
            "exit with its command's status",
            True,
            "exit 42",
            lambda outcome: outcome.status == 42,
            lambda plan: plan.replace(chdir="/nonexistent"),
        ),
    ]


# A CONNECT through the session's proxy (the relay on its loopback) to argv[1]; prints what
# the tunnel brings back (the host's loopback service says who it is), or the proxy's refusal.
_TUNNEL = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\r\nHost: {sys.argv[1]}\r\n\r\n".encode())
got = b""
while b"loopback" not in got and (chunk := s.recv(4096)):
    got += chunk
print(got.decode(errors="replace"))
"""

# A call to the API as a harness makes it: to its base URL, with the key it holds (a placeholder).
_CALL_API = """
import os, urllib.request, urllib.error
request = urllib.request.Request(
    os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
    data=b"{}",
    headers={"x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")},
)
try:
    print(urllib.request.urlopen(request, timeout=20).read().decode(), end="")
except OSError as error:
    print(error)
"""


_OPEN_SYSCTLS = r"""
import os
opened = 0
for root, dirs, files in os.walk("/proc/sys"):
    for name in files:
        try:
            os.close(os.open(os.path.join(root, name), os.O_WRONLY))  # opened, never written
            opened += 1
        except OSError:
            pass
print(opened)
"""
