"""The tool table, name lookup, tool descriptions and score normalization (no pyiqa forward passes)."""
from __future__ import annotations

import math

import pytest

from iqa_tools import STRENGTHS, ToolRegistry, ToolTableError, UnknownToolError
from iqa_tools.normalize import normalize_score
from iqa_tools.table import load_table

# DESIGN §4 (paper Table 5): name, pyiqa metric, mode, lower-is-better, β.
PAPER = {
    "TOPIQ_FR": ("topiq_fr", "FR", False, (21.73, 0.1147, 0.4721, 3.5654, 1.0094)),
    "AHIQ": ("ahiq", "FR", False, (0.4280, -592.6356, -2.4819, 3.7677, 1.6143)),
    "FSIM": ("fsim", "FR", False, (265.7031, 23.2940, 1.2003, 1.9193, 133.0061)),
    "LPIPS": ("lpips", "FR", True, (-2.0915, 3.7543, -28.0133, -4.7251, 4.9710)),
    "DISTS": ("dists", "FR", True, (-6.3380, -7.0362, -147.7936, -8.4514, 1.0753)),
    "WaDIQaM_FR": ("wadiqam_fr", "FR", False, (41.8259, 0.0997, -0.3064, 23.1826, 3.5943)),
    "GMSD": ("gmsd", "FR", True, (-5.9925, -23.3876, -59.6895, -13.8274, 1.0789)),
    "SSIM": ("ssim", "FR", False, (94.4202, 64.9155, 1.0664, 2.8744, 47.6819)),
    "CKDN": ("ckdn", "FR", False, (21.6375, 3.1301, 0.3708, -12.3232, 6.7834)),
    "VIF": ("vif", "FR", False, (0.4119, 49.7978, 0.2237, 2.4370, 1.3850)),
    "QAlign": ("qalign", "NR", False, (28.8204, 0.1469, 6.1941, -0.1906, 6.7863)),
    "CLIPIQA": ("clipiqa", "NR", False, (21.7287, 0.1147, 0.4721, 3.5654, 1.0094)),
    "UNIQUE": ("unique", "NR", False, (52.5605, 0.2967, 0.8558, -2.9510, 5.6368)),
    "HyperIQA": ("hyperiqa", "NR", False, (0.4071, 39.0359, 0.3155, 3.1472, 0.9815)),
    "TReS": ("tres", "NR", False, (-0.0550, 6559.4161, 48.9070, 0.0255, 1.1176)),
    "MUSIQ": ("musiq", "NR", False, (2.4078, -0.1123, 32.0686, 0.0734, -0.7363)),
    "WaDIQaM_NR": ("wadiqam_nr", "NR", False, (106.9844, 1.2931, -0.3321, -31.9917, -8.0786)),
    "DBCNN": ("dbcnn", "NR", False, (38.5349, 0.0851, 0.5159, 3.4921, 0.8607)),
    "ARNIQA": ("arniqa", "NR", False, (2.2932, -13.4107, 0.2884, 7.5144, -0.6274)),
    "NIMA": ("nima", "NR", False, (1.0129, 5.3579, 4.6475, 0.3207, 1.0601)),
    "BRISQUE": ("brisque", "NR", True, (-2.2106, 0.0684, 54.3418, 0.0050, 2.2728)),
    "NIQE": ("niqe", "NR", True, (-1.4174, 0.8785, 6.9416, -0.0059, 2.7374)),
    "MANIQA": ("maniqa", "NR", False, (0.6818, 27.4817, 0.2621, 2.5196, 1.5758)),
    "LIQE": ("liqe", "NR", False, (0.1494, 7.1114, 3.2801, 0.6936, 0.8655)),
    "PieAPP": ("pieapp", "FR", True, None),
    "MS-SSIM": ("ms_ssim", "FR", False, None),
    "PSNR": ("psnr", "FR", False, None),
    "VSI": ("vsi", "FR", False, None),
}
WEIGHT_FREE = {"PIQE": "NR", "PSNR": "FR", "SSIM": "FR", "MS-SSIM": "FR", "FSIM": "FR", "VIF": "FR", "GMSD": "FR", "VSI": "FR", "NLPD": "FR"}


@pytest.fixture(scope="module")
def reg():
    return ToolRegistry(cache=False, offline=True)


def test_bundled_table_has_the_paper_tools_exactly(reg):
    for name, (metric, mode, lower_better, beta) in PAPER.items():
        spec = reg.spec(name)
        assert (spec.metric, spec.mode, spec.lower_better) == (metric, mode, lower_better), name
        assert spec.beta == beta, name
    for name, mode in WEIGHT_FREE.items():
        spec = reg.spec(name)
        assert spec.mode == mode and not spec.needs_weights and spec.weight_files == []


def test_table_agrees_with_pyiqa_configs(reg):
    from pyiqa.default_model_configs import DEFAULT_CONFIGS

    for spec in reg.table.tools.values():
        cfg = DEFAULT_CONFIGS[spec.metric]
        assert cfg["metric_mode"] == spec.mode, spec.name
        assert cfg.get("lower_better", False) == spec.lower_better, spec.name
        assert set(spec.strengths) <= set(STRENGTHS)
        assert len(spec.description) > 20


def test_paper_strengths(reg):
    assert set(reg.spec("TOPIQ_FR").strengths) == set(STRENGTHS)
    assert reg.spec("DISTS").strengths == ["Blurs"]
    assert reg.spec("LIQE").strengths == ["Color distortions"]
    assert reg.spec("VIF").strengths == ["Compression"]
    assert "Spatial distortions" in reg.spec("QAlign").strengths
    assert reg.spec("MUSIQ").strengths == []


@pytest.mark.parametrize(
    "given, canonical",
    [("topiq_fr", "TOPIQ_FR"), ("TOPIQ-FR", "TOPIQ_FR"), ("ms-ssim", "MS-SSIM"), ("ms_ssim", "MS-SSIM"),
     ("MSSSIM", "MS-SSIM"), ("q-align", "QAlign"), ("qalign", "QAlign"), ("cw_ssim", "CW-SSIM"),
     ("wadiqam_nr", "WaDIQaM_NR"), ("Piqe", "PIQE"), ("hyperiqa", "HyperIQA"), ("nope", None)],
)  # fmt: skip
def test_resolve_name_is_tolerant(reg, given, canonical):
    assert reg.resolve_name(given) == canonical


def test_unknown_tool_lists_close_matches(reg):
    with pytest.raises(UnknownToolError, match="did you mean.*BRISQUE"):
        reg.spec("BRISQE")


def test_describe_tools_filters_by_mode_and_availability(reg):
    nr = reg.describe_tools("NR")
    assert "- PIQE (NR; strengths: no known strengths):" in nr
    assert "NIQE" in nr and "SSIM" not in nr
    assert "QAlign" not in nr  # needs weights not present here
    everything = reg.describe_tools("NR", available_only=False)
    assert "QAlign (NR; strengths: Blurs, Color distortions, Noise" in everything
    fr = reg.describe_tools("FR")
    assert "VIF (FR; strengths: Compression)" in fr and "PIQE" not in fr
    assert {s.name for s in reg.available_tools()} >= set(WEIGHT_FREE) | {"NIQE", "CW-SSIM"}


# DESIGN §4 check values.
@pytest.mark.parametrize(
    "tool, raw, expected",
    [("QAlign", 3.0, 2.89), ("QAlign", 1.3984, 1.64), ("QAlign", 4.4453, 4.10), ("CLIPIQA", 0.394, 2.37), ("SSIM", 0.7, 2.48)],
)
def test_logistic_normalization_matches_design(reg, tool, raw, expected):
    q, how = reg.normalize(tool, raw)
    assert how == "logistic"
    assert q == pytest.approx(expected, abs=0.006)


def test_logistic_is_stable_and_clipped(reg):
    for x in (-1e6, -50.0, 0.0, 50.0, 1e6):
        q, _ = reg.normalize("QAlign", x)
        assert 1.0 <= q <= 5.0 and math.isfinite(q)
    with pytest.raises(ValueError):
        reg.normalize("QAlign", float("nan"))


def test_linear_normalization_respects_direction(reg):
    assert reg.normalize("PIQE", 0.0) == (5.0, "linear")  # lower is better
    assert reg.normalize("PIQE", 100.0) == (1.0, "linear")
    assert reg.normalize("PIQE", 50.0)[0] == pytest.approx(3.0)
    lo, hi = reg.spec("PSNR").score_range
    assert reg.normalize("PSNR", hi + 10) == (5.0, "linear")
    assert reg.normalize("PSNR", (lo + hi) / 2)[0] == pytest.approx(3.0)
    assert normalize_score(0.25, beta=None, score_range=(0, 1), lower_better=True) == (4.0, "linear")


def test_user_file_adds_and_overrides_tools(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text(
        """
tools:
  - name: PSNR
    beta: [1, 1, 30, 0, 3]
  - name: PSNR_Y
    metric: psnry
    mode: FR
    lower_better: false
    score_range: [10, 60]
    description: PSNR on the luma channel only, our own addition.
"""
    )
    reg = ToolRegistry(table_paths=[user], cache=False, offline=True)
    assert reg.spec("PSNR").beta == (1, 1, 30, 0, 3)
    assert reg.spec("PSNR").metric == "psnr"  # other fields kept from the bundled entry
    assert reg.normalize("PSNR", 30.0) == (3.0, "logistic")
    assert reg.spec("psnr-y").name == "PSNR_Y" and reg.availability("PSNR_Y") == (True, "weight-free")
    assert reg.normalize("PSNR_Y", 60.0) == (5.0, "linear")


def test_user_json_file(tmp_path):
    user = tmp_path / "mine.json"
    user.write_text('{"tools": [{"name": "GMSD", "version": "2"}]}')
    assert load_table([user]).tools["GMSD"].version == "2"


@pytest.mark.parametrize(
    "entry, message",
    [
        ("  - name: PSNR\n    mode: XR\n", r"tool #1 \(PSNR\): field `mode`"),
        ("  - name: PSNR\n    beta: [1, 2, 3]\n", r"tool #1 \(PSNR\): field `beta`"),
        ("  - name: PSNR\n    score_range: [5, 1]\n", r"field `score_range`: must be \[low, high\]"),
        ("  - name: PSNR\n    strengths: [Blur]\n", r"field `strengths.0`"),
        ("  - name: PSNR\n    lower_beter: true\n", r"field `lower_beter`: Extra inputs are not permitted"),
        ("  - name: NEW\n    metric: psnr\n", r"tool #1 \(NEW\): field `mode`: Field required"),
        ("  - metric: psnr\n", r"tool #1: each entry needs a `name`"),
        ("  - name: A\n  - name: A\n", r"tool #2 \(A\): name appears twice"),
    ],
)
def test_bad_user_entries_name_the_entry_and_field(tmp_path, entry, message):
    user = tmp_path / "bad.yaml"
    user.write_text("tools:\n" + entry)
    with pytest.raises(ToolTableError, match=message) as info:
        load_table([user])
    assert str(user) in str(info.value)


def test_bad_user_files(tmp_path):
    with pytest.raises(ToolTableError, match="file not found"):
        load_table([tmp_path / "missing.yaml"])
    (tmp_path / "x.yaml").write_text("tools: [unclosed")
    with pytest.raises(ToolTableError, match="not valid YAML"):
        load_table([tmp_path / "x.yaml"])
    (tmp_path / "y.yaml").write_text("tool:\n  - name: PSNR\n")
    with pytest.raises(ToolTableError, match="unknown top-level key"):
        load_table([tmp_path / "y.yaml"])
    (tmp_path / "z.yaml").write_text("fallback:\n  generic: [NOPE]\n")
    with pytest.raises(ToolTableError, match="'NOPE', which is not a tool"):
        load_table([tmp_path / "z.yaml"])
