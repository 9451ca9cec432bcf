#!/usr/bin/env python3
"""Packs the Python package of a build tree into a wheel, without building
anything again:

    /usr/bin/python3 python/make_wheel.py [--build-dir build] [--out-dir build/dist]

Run it with the interpreter the build's module is for (the wheel's tags are
that interpreter's). The wheel holds what `pip install .` installs: the
package (build/python/capstan: its Python files and the extension module)
with libcapstan.so beside the module under its soname, the module's
RUNPATH set to $ORIGIN (patchelf, on a copy); its metadata comes from
pyproject.toml. Prints the wheel's path. The
wheel links this machine's Cap'n Proto, protobuf, Boost and spdlog, as
`pip install .` does: install it where it was built (or on a machine with
the same Debian packages). Python 3.11+ standard library only.
"""
import argparse
import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def tags():
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return python, python, platform


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=str(REPO / "build"))
    parser.add_argument("--out-dir", default=None, help="default: BUILD_DIR/dist")
    args = parser.parse_args()
    build = pathlib.Path(args.build_dir).resolve()
    out_dir = pathlib.Path(args.out_dir or build / "dist").resolve()
    if not (build / "CMakeCache.txt").is_file():
        sys.exit(f"make_wheel: {build} is not a configured build directory (run scripts/build.sh first)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not (build / "python" / "capstan" / f"_capstan{suffix}").is_file():
        sys.exit(f"make_wheel: {build}/python/capstan has no _capstan{suffix}: the build's module is for another "
                 f"interpreter than {sys.executable}, or was not built (configure with -DPython3_EXECUTABLE=...)")

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    python_tag, abi_tag, platform_tag = tags()
    tag = f"{python_tag}-{abi_tag}-{platform_tag}"
    dist_info = f"{name}-{version}.dist-info"

    package = build / "python" / "capstan"
    files = {}
    for path in sorted(package.glob("*.py")):
        files[f"capstan/{path.name}"] = path.read_bytes()
    # libcapstan.so under the soname the module asks for, as a file (a wheel
    # holds no symbolic links).
    needed = subprocess.run(["patchelf", "--print-needed", str(package / f"_capstan{suffix}")], check=True,
                            capture_output=True, text=True).stdout.split()
    sonames = [n for n in needed if n.startswith("libcapstan.so")]
    if len(sonames) != 1:
        sys.exit(f"make_wheel: the module needs {needed}: expected one libcapstan.so")
    library = build / "lib" / sonames[0]
    if not library.exists():
        sys.exit(f"make_wheel: {library} is missing (build the whole tree: scripts/build.sh)")
    with tempfile.TemporaryDirectory() as staging:
        # Copies without debug information (as pip's install.strip), the
        # module's RUNPATH $ORIGIN.
        module = pathlib.Path(staging) / f"_capstan{suffix}"
        copy = pathlib.Path(staging) / sonames[0]
        module.write_bytes((package / f"_capstan{suffix}").read_bytes())
        copy.write_bytes(library.resolve().read_bytes())
        subprocess.run(["strip", "--strip-debug", str(module), str(copy)], check=True)
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", str(module)], check=True)
        files[f"capstan/_capstan{suffix}"] = module.read_bytes()
        files[f"capstan/{sonames[0]}"] = copy.read_bytes()

    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
        f"License: {project['license']['text']}",
    ]
    metadata += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        metadata.append(f"Provides-Extra: {extra}")
        metadata += [f'Requires-Dist: {r}; extra == "{extra}"' for r in requirements]
    metadata.append("")
    metadata.append((REPO / project["readme"]).read_text())
    files[f"{dist_info}/METADATA"] = "\n".join(metadata).encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: capstan make_wheel.py\nRoot-Is-Purelib: false\n"
                                   f"Tag: {tag}\n").encode()
    record = [record_line(path, data) for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-{tag}.whl"
    partial = wheel.with_suffix(".whl.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            # Executable bits for the shared libraries, as pip restores them.
            info.external_attr = (0o755 if path.endswith(".so") or ".so." in path else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(partial, wheel)
    print(wheel)


if __name__ == "__main__":
    main()
