"""One of NVIDIA's PyPI wheels, unpacked once under target/<cache>/<pkg>-<version>/ (the part
of it a check needs): the headers for ci/check-abi.py, ptxas for ci/check-ptx.py."""
import glob
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fetch(cache, pkg, version, keep, want):
    """The first path matching `want` (a glob under the unpacked wheel), downloading the wheel and
    extracting the members `keep(name)` accepts when it is not there yet; (path, None), or
    (None, why) when pip or the wheel fails."""
    dest = os.path.join(ROOT, "target", cache, f"{pkg}-{version}")
    found = glob.glob(os.path.join(dest, want), recursive=True)
    if not found:
        os.makedirs(dest, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, f"{pkg}=={version}"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines()[-1:] or ["pip failed"])[0]
        for whl in glob.glob(os.path.join(dest, "*.whl")):
            with zipfile.ZipFile(whl) as z:
                z.extractall(dest, [n for n in z.namelist() if keep(n)])
        found = glob.glob(os.path.join(dest, want), recursive=True)
    return (found[0], None) if found else (None, f"nothing like {want} in {pkg} {version}")
