"""A root that holds only what a Linux with Python has: the C and C++ runtimes, the
libraries the interpreter itself links (each Debian package's files, found from the
interpreter's and its extension modules' dependencies), /bin/sh, and /etc's users and
hosts. None of the -dev packages, yaml-cpp, liburing or CUDA toolkit zeroshard builds
with. The interpreter's prefix, a venv's packages and a work folder are bound into it at
their own paths, in a mount namespace of the command's own (nothing outlives it)."""
import glob
import os
import shutil
import subprocess
import sys

# What the root holds beyond the interpreter's own needs: the C and C++ runtimes and a shell.
BASE_PACKAGES = ("libc6", "libgcc-s1", "libstdc++6", "dash")
ETC = ("passwd", "group", "hosts", "nsswitch.conf")


def _linked_files(paths):
    """Every library the dynamic loader resolves for `paths` (ELF files), by path."""
    found = set()
    for path in paths:
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                found.add(parts[1].split()[0])
    return found


def _packages_of(files):
    packages = set()
    for f in files:
        out = subprocess.run(["dpkg", "-S", os.path.realpath(f)], capture_output=True, text=True)
        if out.returncode != 0:  # usrmerge: dpkg knows /lib/... where ldd says /usr/lib/...
            alt = os.path.realpath(f).replace("/usr/lib/", "/lib/", 1)
            out = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True)
        if out.returncode == 0:
            packages.add(out.stdout.split(":")[0])
    return packages


def make(root):
    """Fills `root` (an empty folder); returns the Debian packages it holds."""
    prefix = sys.base_prefix
    elves = [os.path.realpath(sys._base_executable)]
    elves += glob.glob(os.path.join(prefix, "lib", "python3*", "lib-dynload", "*.so"))
    elves += glob.glob(os.path.join(prefix, "lib", "libpython*.so*"))
    packages = set(BASE_PACKAGES) | _packages_of(_linked_files(elves))
    # Debian's merged /usr first: /lib, /lib64, /bin and /sbin are links into /usr, so a
    # package's /bin/dash lands in /usr/bin as on the host.
    for link in ("lib", "lib64", "bin", "sbin"):
        if os.path.islink("/" + link):
            os.makedirs(os.path.join(root, "usr", link), exist_ok=True)
            os.symlink(os.readlink("/" + link), os.path.join(root, link))
    for package in sorted(packages):
        listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True,
                                 check=True).stdout.split()
        for path in listing:
            if path.startswith("/usr/share/") or os.path.isdir(path) and not os.path.islink(path):
                continue
            target = root + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.islink(path):
                if not os.path.lexists(target):
                    os.symlink(os.readlink(path), target)
            elif os.path.exists(path):
                shutil.copy2(path, target)
    if not os.path.lexists(root + "/usr/bin/sh"):
        os.symlink("dash", root + "/usr/bin/sh")
    for name in ETC:
        if os.path.exists("/etc/" + name):
            os.makedirs(root + "/etc", exist_ok=True)
            shutil.copy2("/etc/" + name, root + "/etc/" + name)
    for folder in ("proc", "dev", "sys", "tmp"):
        os.makedirs(root + "/" + folder, exist_ok=True)
    return packages


def entry(root, binds, script):
    """A command prefix that runs a program inside `root`, in the caller's working folder,
    with `binds` (folders) bound at their own paths; `script` is where its shell goes."""
    lines = ["set -e", f'R="{root}"', 'mount -t proc proc "$R/proc"',
             'mount --rbind /dev "$R/dev"', 'mount --rbind /sys "$R/sys"',
             'mount -t tmpfs tmpfs "$R/tmp"']
    for b in binds:
        lines += [f'mkdir -p "$R{b}"', f'mount --bind "{b}" "$R{b}"']
    lines.append('exec chroot "$R" /bin/sh -c \'cd "$0" && exec "$@"\' "$PWD" "$@"')
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", script]
