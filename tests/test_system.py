"""The read-only system every plan starts with, as a session sees it: /proc/sys and every other
writable procfs entry are read-only entries (not one sysctl opens for write); the files tools
read are there, the machine id is the session's own, the CPU topology shows through a
read-only /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import (
    read_to_eof,
    session,
    sh,
)

import nsconfine

pytestmark = [pytest.mark.confinement, pytest.mark.usefixtures("sandbox_ready")]


_WRITE_EVERY_SYSCTL = r"""
import os, sys
opened = []
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                os.close(os.open(path, os.O_WRONLY))  # opened, never written
                opened.append(path)
            except OSError:
                pass
print(len(opened), *opened[:5])
"""


def _writable_proc_entries(plan: nsconfine.Plan) -> list[str]:
    return [e.dest for e in plan.entries if e.dest.startswith("/proc/") and e.kind == "bind"]


def test_proc_sys_and_friends_are_read_only_entries(plan: nsconfine.Plan) -> None:
    """/proc/sys (and every other writable procfs entry this host has) is a read-only entry
    of the plan, with its reason."""
    entries = {e.dest: e for e in plan.entries}
    assert entries["/proc/sys"].mode == "ro"
    assert entries["/proc/sys"].reason
    for path in ("/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/mtrr", "/proc/pressure"):
        if os.path.lexists(path):
            assert entries[path].mode == "ro", path


def test_no_sysctl_opens_for_write(plan: nsconfine.Plan) -> None:
    """Not one file under the writable procfs entries opens for write in a session."""
    tops = ["/proc/sys", *_writable_proc_entries(plan)]
    status, output = sh(plan, f"python3 -c '{_WRITE_EVERY_SYSCTL}' {' '.join(tops)}")
    assert status == 0, output
    assert output.split()[0] == "0", output


def _sysctls_opened_for_write(plan: nsconfine.Plan) -> int:
    from helpers import unchecked_launcher

    read_end, write_end = os.pipe()
    sandbox = unchecked_launcher(
        plan,
        ["python3", "-c", _WRITE_EVERY_SYSCTL, "/proc/sys"],
        stdout=write_end,
        stderr=write_end,
    )
    os.close(write_end)
    output = (read_to_eof(read_end, 60) or b"").decode()
    os.close(read_end)
    sandbox.wait(timeout=60)
    return int(output.split()[0])


def test_without_the_entries_some_sysctl_opens_for_write(plan: nsconfine.Plan) -> None:
    """The twin: without the read-only entries the session opens sysctls of its own
    namespaces for write, so the check above can fail."""
    weakened = plan.replace(entries=tuple(e for e in plan.entries if e.dest != "/proc/sys"))
    assert _sysctls_opened_for_write(weakened) > 0


def test_system_files_tools_read_are_there(ws_run: tuple[Path, Path]) -> None:
    """/etc/os-release, and /etc/locale.alias and /etc/manpath.config where the host has them
    (a fresh Debian has neither: they come with locales and man-db), are readable, and
    /etc/machine-id is the session's own, not the host's."""
    plan = session(*ws_run).plan()
    _status, output = sh(
        plan,
        "grep -q ^ID= /etc/os-release && echo os-release; test -r /etc/locale.alias && echo alias; "
        "test -r /etc/manpath.config && echo manpath; cat /etc/machine-id",
    )
    lines = output.split()
    assert "os-release" in lines, output
    for word, path in (("alias", "/etc/locale.alias"), ("manpath", "/etc/manpath.config")):
        assert (word in lines) == os.path.exists(path), output
    machine_id = lines[-1]
    assert len(machine_id) == 32, output
    with open("/etc/machine-id") as file:
        assert machine_id != file.read().strip()
    entries = {e.dest: e for e in plan.entries}
    assert "host's" in entries["/etc/machine-id"].reason


def test_cpu_topology_is_visible(ws_run: tuple[Path, Path]) -> None:
    """A read-only /sys subset: lscpu works and reports this host's CPUs; /sys is not
    writable."""
    _status, output = sh(
        session(*ws_run).plan(),
        "lscpu | grep -i '^CPU(s):'; nproc; (echo x > /sys/devices/system/cpu/x) 2>&1 || true",
    )
    assert "CPU(s):" in output, output
    assert str(os.cpu_count()) in output
    assert "Read-only" in output or "Permission denied" in output


_ADD_KEY = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
# add_key("user", name, payload, 6, KEY_SPEC_USER_KEYRING): the account's own keyring
serial = libc.syscall(248, b"user", sys.argv[1].encode(), b"secret", 6, ctypes.c_int(-4))
print(serial if serial > 0 else -ctypes.get_errno())
"""
# keyctl(KEYCTL_UNLINK, key, KEY_SPEC_USER_KEYRING): the account may write its own keyring,
# and the key, linked nowhere else, is then collected. (KEYCTL_INVALIDATE needs search
# permission on the key, which only its possessor has: a process started from root's session
# keyring does not possess the account's, and every run left its key behind, against the
# account's quota of 200 keys that its sessions' keyrings count against too.)
_DROP_KEY = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(250, 9, int(sys.argv[1]), ctypes.c_int(-4)) != 0:
    sys.exit(f"keyctl(KEYCTL_UNLINK) failed: errno {ctypes.get_errno()}")
"""


def _as_session_account(code: str, *arguments: str) -> str:
    """Run code in /usr/bin/python3 as the sessions' account (the launcher's own, unless
    root); its output."""
    import subprocess

    from helpers import session_gid, session_uid

    as_root = os.geteuid() == 0
    done = subprocess.run(
        ["/usr/bin/python3", "-c", code, *arguments],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        user=session_uid() if as_root else None,
        group=session_gid() if as_root else None,
    )
    return done.stdout.strip()


def test_the_accounts_keys_are_not_listed_in_a_session(plan: nsconfine.Plan) -> None:
    """/proc/keys and /proc/key-users show a session nothing: the kernel lists there, by name,
    every key its account may view (a token a tool of the host put in the account's keyring)
    and every other session's keyring (attacker's pass, stop 32). The twin, without the
    entries that cover them, shows the key, so the check can fail."""
    import uuid

    name = f"nsconfine-test-key-{uuid.uuid4().hex[:12]}"
    serial = _as_session_account(_ADD_KEY, name)
    assert int(serial) > 0, f"add_key failed: errno {serial}"
    try:
        script = "cat /proc/keys /proc/key-users 2>&1; echo listed"
        status, output = sh(plan, script)
        assert status == 0, output
        assert "listed" in output, output
        assert name not in output, output
        assert "_ses" not in output, output
        weakened = plan.without("/proc/keys").without("/proc/key-users")
        assert name in sh(weakened, script)[1]
    finally:
        _as_session_account(_DROP_KEY, serial)


def test_the_hosts_lock_table_is_not_read_from_a_session(plan: nsconfine.Plan) -> None:
    """A read of /proc/locks takes the kernel's global file-lock lock and walks every lock on
    the host, whatever the reader's pid namespace shows of them: a session holding 300,000
    locks and reading the table held every flock() on the host 12-48 ms and eight launches at
    once 6.6 s (attacker's pass, stop 41). The session's /proc/locks is an empty file of
    nsconfine's, no procfs file; the twin, without the entry that covers it, reads procfs, so
    the check can fail."""
    script = "stat -f -c %T /proc/locks; cat /proc/locks; echo read"
    status, output = sh(plan, script)
    assert status == 0, output
    assert output.split() == ["tmpfs", "read"], output
    assert sh(plan.without("/proc/locks"), script)[1].split()[0] == "proc"


def test_the_session_has_a_hostname_of_its_own(plan: nsconfine.Plan) -> None:
    """The session's host name is `localhost` (which /etc/hosts resolves, as tools expect of
    their host's name), not the host's, which names the machine, as its machine id would
    (attacker's pass, stop 32: the UTS namespace was the session's own, its name the host's);
    nor does its /etc/hosts name the machine (hostile review: the host's was bound)."""
    import socket

    if socket.gethostname() == "localhost":
        pytest.skip("this host is named localhost")
    script = "name=$(cat /proc/sys/kernel/hostname); echo $name; getent hosts $name; cat /etc/hosts"
    status, output = sh(plan, script)
    assert status == 0, output
    assert output.split()[0] == "localhost", output
    assert socket.gethostname() not in output.split(), output
