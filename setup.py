# cffi_modules cannot be declared in pyproject.toml alone (see README, "Building").
# build_ext also builds csrc/shim.c, the exec shim of nsconfine.Pool, as an executable in the
# package (nsconfine/_shim): in build_lib for `pip install .`, in the source tree for -e.
from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_ext import build_ext

SHIM_SOURCE = "csrc/shim.c"
SHIM_NAME = "_shim"
SHIM_FLAGS = ["-Wall", "-Wextra", "-O2"]  # shim.c defines _GNU_SOURCE itself


class build_ext_with_shim(build_ext):
    """build_ext, then the shim with the same compiler (so CC and the toolchain are shared)."""

    def run(self) -> None:
        super().run()
        self._build_shim()

    def _shim_path(self) -> str:
        if self.inplace:
            package_dir = self.get_finalized_command("build_py").get_package_dir("nsconfine")
            return os.path.join(package_dir, SHIM_NAME)
        return os.path.join(self.build_lib, "nsconfine", SHIM_NAME)

    def _build_shim(self) -> None:
        from distutils.errors import LinkError  # setuptools vendors distutils

        output = self._shim_path()
        objects = self.compiler.compile(
            [SHIM_SOURCE], output_dir=self.build_temp, extra_postargs=SHIM_FLAGS
        )
        os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
        try:
            # Static, so the shim runs in a plan that binds no libraries; stripped, so small.
            self.compiler.link_executable(objects, output, extra_postargs=["-static", "-s"])
        except LinkError:
            self.warn("cannot link the exec shim statically (no libc.a?): linking it dynamically")
            self.compiler.link_executable(objects, output, extra_postargs=["-s"])
        os.chmod(output, 0o755)

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), self._shim_path()]


setup(cffi_modules=["csrc/_build.py:ffibuilder"], cmdclass={"build_ext": build_ext_with_shim})
