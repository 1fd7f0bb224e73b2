# cffi_modules cannot be declared in pyproject.toml alone (see README, "Building").
# build_ext also builds nsconfine's two helper programs, as executables in the package: in
# build_lib for `pip install .`, in the source tree for -e.
#   nsconfine/_reaper  csrc/reaper.c: the launcher's child, which runs bwrap and kills what it
#                      leaves behind
#   nsconfine/_shim    csrc/shim.c: runs inside each sandbox and execs the command it is handed
#                      (csrc/relay.c: its loopback relay, for a "proxy" network)
from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_ext import build_ext

HELPERS = {"_reaper": ["csrc/reaper.c"], "_shim": ["csrc/shim.c", "csrc/relay.c"]}
# No libc (csrc/freestanding.h says why): static, freestanding, our own _start.
HELPER_FLAGS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-O2",
    "-ffreestanding",
    "-fno-stack-protector",
    "-fno-tree-loop-distribute-patterns",  # keep memcpy's loop from becoming a memcpy call
    "-fno-asynchronous-unwind-tables",
    "-fno-pie",
]
HELPER_LINK_FLAGS = ["-static", "-nostdlib", "-no-pie", "-s", "-lgcc"]  # libgcc: popcount


class build_ext_with_helpers(build_ext):
    """build_ext, then the helpers with the same compiler (so CC and the toolchain are shared)."""

    def run(self) -> None:
        super().run()
        for name, sources in HELPERS.items():
            self._build_helper(name, sources)

    def _helper_path(self, name: str) -> str:
        if self.inplace:
            package_dir = self.get_finalized_command("build_py").get_package_dir("nsconfine")
            return os.path.join(package_dir, name)
        return os.path.join(self.build_lib, "nsconfine", name)

    def _build_helper(self, name: str, sources: list[str]) -> None:
        output = self._helper_path(name)
        objects = self.compiler.compile(
            [*sources, "csrc/freestanding.c"],
            output_dir=os.path.join(self.build_temp, name),
            include_dirs=["csrc"],
            extra_postargs=HELPER_FLAGS,
        )
        os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
        self.compiler.link_executable(objects, output, extra_postargs=HELPER_LINK_FLAGS)
        os.chmod(output, 0o755)

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), *(self._helper_path(name) for name in HELPERS)]


setup(cffi_modules=["csrc/_build.py:ffibuilder"], cmdclass={"build_ext": build_ext_with_helpers})
