"""Fit NIQE's pristine-image model ourselves, since pyiqa's parameter file cannot be obtained here.

NIQE's "model" is a multivariate Gaussian (mean, covariance) of 36 natural-scene-statistics features
computed on 96×96 patches of pristine photos (18 features at full and at half scale); an image's score is
the distance between that Gaussian and the same fit on the image's own patches. As in the original
recipe, only the sharpest patches of each training photo are kept (mean local deviation above 0.75 of the
photo's sharpest patch), so that flat sky or defocused background does not count as "pristine".

We use pyiqa's own feature code, so the fitted file plugs straight into `pyiqa.create_metric("niqe",
pretrained_model_path=...)`. The training photos are scikit-image's bundled samples (they load offline),
which is far fewer than the original corpus: absolute values differ from published NIQE.

Regenerate the shipped file with:  python -m iqa_tools.niqe_fit
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

PRISTINE = ("astronaut", "chelsea", "coffee", "rocket", "camera", "coins", "moon", "brick", "grass", "gravel")
DEFAULT_OUTPUT = Path(__file__).with_name("data") / "niqe_skimage_v1.mat"
BLOCK = 96
SHARPNESS_THRESHOLD = 0.75
# Patches are also taken at half-block offsets: 4× the (correlated) samples for a 36×36 covariance.
OFFSETS = ((0, 0), (0, BLOCK // 2), (BLOCK // 2, 0), (BLOCK // 2, BLOCK // 2))


def _luma_255(rgb_or_gray: np.ndarray):
    """The Y channel on 0..255, rounded, float64 — exactly what pyiqa's NIQE feeds its features."""
    import torch
    from pyiqa.archs.func_util import diff_round
    from pyiqa.utils.color_util import to_y_channel

    t = torch.from_numpy(np.ascontiguousarray(rgb_or_gray)).float() / 255.0
    t = t.permute(2, 0, 1)[None] if t.ndim == 3 else t[None, None].repeat(1, 3, 1, 1)
    return diff_round(to_y_channel(t, 255, "yiq")).double()


def _patch_features(y) -> np.ndarray:
    """36 features per sharp 96×96 patch of one luma image, shape (n_patches, 36)."""
    import torch
    from pyiqa.archs.func_util import normalize_img_with_gauss
    from pyiqa.archs.niqe_arch import compute_feature
    from pyiqa.matlab_utils import blockproc, fspecial, imfilter, imresize

    kernel = fspecial(7, 7 / 6, 1).to(y)
    mu = imfilter(y, kernel, padding="replicate")
    sigma = (imfilter(y * y, kernel, padding="replicate") - mu * mu).abs().sqrt()
    sharpness = blockproc(sigma, [BLOCK, BLOCK], fun=lambda b, _: b.mean(dim=(1, 2, 3)).reshape(-1, 1))[0, :, 0]

    per_scale = []
    img = y
    for scale in (1, 2):
        normalized = normalize_img_with_gauss(img, padding="replicate")
        per_scale.append(blockproc(normalized, [BLOCK // scale, BLOCK // scale], fun=compute_feature))
        if scale == 1:
            img = imresize(img / 255.0, scale=0.5, antialiasing=True) * 255.0
    feats = torch.cat(per_scale, dim=-1)[0]
    keep = sharpness > SHARPNESS_THRESHOLD * sharpness.max()
    return feats[keep].numpy()


def fit(images) -> tuple[np.ndarray, np.ndarray, int]:
    """(mean (36,), covariance (36, 36), number of patches) over the sharp patches of `images`."""
    rows = []
    for arr in images:
        y = _luma_255(arr)
        for dy, dx in OFFSETS:
            rows.append(_patch_features(y[..., dy:, dx:]))
    feats = np.concatenate(rows)
    feats = feats[np.isfinite(feats).all(axis=1)]
    return feats.mean(axis=0), np.cov(feats, rowvar=False), len(feats)


def write(path: Path = DEFAULT_OUTPUT, names=PRISTINE) -> int:
    """Fit on scikit-image samples and save in the layout pyiqa's NIQE loader reads."""
    import scipy.io
    import skimage.data

    mu, cov, n = fit(getattr(skimage.data, name)() for name in names)
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(
        path,
        {
            "mu_prisparam": mu[None, :],
            "cov_prisparam": cov,
            "n_patches": np.array([[n]]),
            "source": "agentic-iqa niqe_fit on scikit-image samples: " + ", ".join(names),
        },
    )
    return n


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    n = write(out)
    print(f"wrote {out} ({n} patches from {len(PRISTINE)} scikit-image photos)")
