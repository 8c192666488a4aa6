"""The real-photo corpus tooling (benchmarks/fit_corpus.py): the manifest names every file's source and
licence, the evaluation ladder differs from the training one yet keeps level order, working copies are
downscaled without upscaling, and the clean offsets come from sources left out of each inner fit."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_corpus as fc  # noqa: E402
from agentic_iqa.bench import synth  # noqa: E402
from agentic_iqa.offline import severity as sv  # noqa: E402


def test_manifest_names_sources_and_licences():
    m = json.loads(fc.MANIFEST.read_text())
    assert len(m["sources"]) >= 4
    for name, src in m["sources"].items():
        assert src["registry"] in ("PyPI", "Debian", "GitHub") and src["licence"] and src["files"], name
        assert len(set(src["files"])) == len(src["files"]), name
        if src["registry"] == "GitHub":  # a pinned commit (not a branch) and every file's SHA-256
            assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and set(src["sha256"]) == set(src["files"]), name
            assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in src["sha256"].values()), name
            assert src["repo"].count("/") == 1 and (src["where"] == "" or src["where"].endswith("/")), name  # "": the root
        else:
            assert src["package"], name
    # no photo is in two sources, and no GitHub file is named twice (same bytes = same photo)
    github = [h for src in m["sources"].values() if src["registry"] == "GitHub" for h in src["sha256"].values()]
    assert len(set(github)) == len(github)
    # no stem is in two sources either (in any case): a new source's selection rule counts that as overlap
    stems = [Path(f).stem.lower() for src in m["sources"].values() for f in src["files"]]
    assert len(set(stems)) == len(stems)


def _assert_scored_blind_once_then_a_fold(src, github_fit=None):
    """A source whose terms allow fitting, once blind: scored once (its "spent" note says with what and what was looked
    at since), then a leave-one-source-out source. ``github_fit``: a GitHub source scored with the shipped fit on that
    many sources."""
    assert src["blind"] is False and "Scored once" in src["spent"]
    assert "it became a leave-one-source-out source" in src["spent"]
    if github_fit is not None:
        assert src["registry"] == "GitHub" and f"with the shipped {github_fit}-source fit" in src["spent"]


def test_cbsd68_is_spent_and_stays_evaluation_only():
    """CBSD68 (68 colour BSDS300 photos) was scored blind once and looked at: its research-only terms keep it out of
    every fit, so it stays a blind-flagged (never fitted) source whose report is labelled spent."""
    m = json.loads(fc.MANIFEST.read_text())
    training, blind = fc.corpus_sources(m), fc.corpus_sources(m, blind=True)
    cbsd = blind["cbsd68"]
    assert cbsd["blind"] is True and cbsd["registry"] == "GitHub" and len(cbsd["files"]) == 68
    assert "non-commercial" in cbsd["licence"] and "evaluation only" in cbsd["licence"]
    assert fc.blind_status(cbsd) == "spent" and "scored blind once" in cbsd["spent"].lower()
    assert not {(s.get("repo"), s.get("where")) for s in training.values()} & {(cbsd["repo"], cbsd["where"])}


def test_mcmaster_is_spent_and_stays_evaluation_only():
    """McMaster (18 film-photo crops, research terms) was scored with --blind-report three times after the decisions it
    reported on: spent, and its terms keep it out of every fit, so it stays blind-flagged, labelled spent."""
    m = json.loads(fc.MANIFEST.read_text())
    mcm = fc.corpus_sources(m, blind=True)["mcmaster"]
    assert mcm["blind"] is True and fc.blind_status(mcm) == "spent" and len(mcm["files"]) == 18
    assert mcm["registry"] == "GitHub" and "evaluation only" in mcm["licence"] and "three times" in mcm["spent"]


def test_budgie_was_scored_once_and_is_a_fold_now():
    """Budgie backgrounds (18 CC0 photographs, 4K JPEG, at a pinned commit): blind for one session, scored once with the
    final fit; its free terms made it a leave-one-source-out source."""
    m = json.loads(fc.MANIFEST.read_text())
    budgie = fc.corpus_sources(m)["budgie"]
    assert budgie["blind"] is False and "spent" not in budgie and len(budgie["files"]) == 18
    assert budgie["registry"] == "GitHub" and budgie["licence"].startswith("CC0-1.0")
    assert "budgie (CC0) was blind for one session, scored once" in m["about"]


def test_urban100_was_scored_once_and_is_spent():
    """Urban100 (Huang, Singh, Ahuja, CVPR 2015: Flickr photos of urban scenes, no licence stated) at a pinned commit:
    blind for one session, scored once with the final fit, so spent; evaluation only (never fitted on), 93 of its
    100 colour PNGs (the seven black-and-white ones left out)."""
    m = json.loads(fc.MANIFEST.read_text())
    blind = fc.corpus_sources(m, blind=True)
    urban = blind["urban100"]
    assert urban["blind"] is True and fc.blind_status(urban) == "spent" and "once" in urban["spent"]
    assert len(urban["files"]) == 93
    assert urban["registry"] == "GitHub" and urban["repo"] == "majedelhelou/denoising_datasets"
    assert urban["commit"] == "58234876fef6f1b56306705c78dfd40cdb837b86" and urban["where"] == "CUrban100/"
    assert urban["licence"].startswith("No licence stated") and "evaluation only" in urban["licence"]
    assert "never fitted on" in urban["licence"] and "Flickr" in urban["licence"]
    for gray in ("img_011", "img_028", "img_036", "img_042", "img_045", "img_072", "img_095"):
        assert f"{gray}.png" not in urban["files"] and gray in urban["licence"]
    assert "urban100 (Urban100" in m["about"] and "scored once (2026-11-26) and spent" in m["about"]
    assert not {(s.get("repo"), s.get("where")) for s in fc.corpus_sources(m).values()} & {(urban["repo"], urban["where"])}


def test_deepin_was_scored_once_and_is_a_fold_now():
    """deepin-wallpapers' Unsplash photographs (16 by 15 photographers, Unsplash License) at a pinned commit: blind for one
    session, scored once and spent; its terms allow fitting, so once a new blind source was found it became a fold. The
    Wang Jinyu photos (CC BY-NC-ND), the renderings and the two files too large to check here are left out and named in
    its licence text."""
    m = json.loads(fc.MANIFEST.read_text())
    deepin = fc.corpus_sources(m)["deepin"]
    _assert_scored_blind_once_then_a_fold(deepin)
    assert len(deepin["files"]) == 16
    assert deepin["registry"] == "GitHub" and deepin["repo"] == "linuxdeepin/deepin-wallpapers"
    assert deepin["commit"] == "ac2fe33778aa16d332066227faaa6cc9baff6a1f" and deepin["where"] == "nonfree/unsplash.com/"
    assert deepin["licence"].startswith("Unsplash License") and "compile images from Unsplash" in deepin["licence"]
    assert all(f.endswith("-unsplash.jpg") for f in deepin["files"])
    for left_out in ("garrett-patz-Ilu1Vv6EYds", "sourav-ghosh-gTvhFsQMqnA"):
        assert f"{left_out}-unsplash.jpg" not in deepin["files"] and left_out in deepin["licence"]
    assert "Wang Jinyu" in deepin["licence"] and "CC BY-NC-ND 4.0" in deepin["licence"]
    assert "deepin (16 Unsplash photographs" in m["about"] and "so it became a fold" in m["about"]


def test_solus_was_scored_once_and_is_a_fold_now():
    """Solus's desktop backgrounds (getsolus/artwork at a pinned commit): 13 photographs by 13 photographers under CC BY or
    CC BY-SA per file, blind for one session, scored once with the final fit, so spent; its terms allow fitting, so once
    a new blind source was found it became a fold. The space image, the abstract art, the logo tiles and the six files
    too large to check here are left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    solus = fc.corpus_sources(m)["solus"]
    _assert_scored_blind_once_then_a_fold(solus)
    assert solus["registry"] == "GitHub" and solus["repo"] == "getsolus/artwork" and solus["where"] == "backgrounds/"
    assert solus["commit"] == "935b24ac299470d3aea8bddf8f4e3e969a9b1abd"
    assert len(solus["files"]) == 13 and "exhibición-freestyle-gp.jpg" in solus["files"]
    for f in solus["files"]:  # every kept photo names its photographer's licence
        assert Path(f).stem in solus["licence"], f
    assert "CC-BY-4.0 (" in solus["licence"] and "CC-BY-SA-4.0 (" in solus["licence"] and "CC-BY-SA-3.0 (" in solus["licence"]
    for left_out in ("AS08-16-2593", "digital-art-background", "green-glass-vase", "solus-tiles-dark", "milky-way",
                     "luxor-nile"):
        assert f"{left_out}.jpg" not in solus["files"] and left_out in solus["licence"]
    assert "noted before any figure" in solus["licence"] and "solus (13 photographs" in m["about"]
    assert "scored once (2026-11-26) and spent" in m["about"].split("solus (13 photographs")[1]
    assert "so it became a fold" in m["about"].split("solus (13 photographs")[1]


def test_popos_was_scored_once_and_is_a_fold_now():
    """Pop!_OS's wallpapers (pop-os/wallpapers at a pinned commit): 10 public-domain Unsplash photographs by 10
    photographers, blind for one session, scored once with the final fit, so spent; its terms allow fitting, so once a new
    blind source was found it became a fold. The space images, the illustrations and the five files the snapshot lacks
    are left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    popos = fc.corpus_sources(m)["popos"]
    _assert_scored_blind_once_then_a_fold(popos)
    assert popos["registry"] == "GitHub" and popos["repo"] == "pop-os/wallpapers" and popos["where"] == "original/"
    assert popos["commit"] == "03a25a14a76eaf3825b980ab50aad6698c1c5a35"
    assert len(popos["files"]) == 10 and set(popos["sha256"]) == set(popos["files"])
    assert popos["licence"].startswith("Public domain") and "Unsplash photos are in the public domain" in popos["licence"]
    for f in popos["files"]:  # every kept photo is named in the licence text
        assert Path(f).stem in popos["licence"], f
    for left_out in ("nasa-45068", "nasa-53884", "nasa-89127", "spacex-81773", "jake-hills-36605", "kate-hazen",
                     "nick-nazzaro", "benjamin-voros-250200", "tim-mccartney-39907"):
        assert not any(f.startswith(left_out) for f in popos["files"]) and left_out in popos["licence"]
    assert "noted before any figure" in popos["licence"] and "popos (10 public-domain" in m["about"]
    assert "so it became a fold" in m["about"].split("popos (10 public-domain")[1]


def test_elementary_was_scored_once_and_is_a_fold_now():
    """elementary OS's wallpapers (elementary/wallpapers at a pinned commit): 9 photographs by 9 photographers, CC0,
    Unsplash or Pexels License per file as the repository's debian/copyright states, blind for one session, scored once
    with the final fit, so spent; its terms allow fitting, so once a new blind source was found it became a fold. The
    photo deepin has too, the space image, the artwork and the three files the snapshot lacks are left out and named;
    the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    el = fc.corpus_sources(m)["elementary"]
    _assert_scored_blind_once_then_a_fold(el)
    assert el["registry"] == "GitHub" and el["repo"] == "elementary/wallpapers" and el["where"] == "backgrounds/"
    assert el["commit"] == "2ce760b00b1e140a372ac5887eaea8a9a2696877"
    assert len(el["files"]) == 9 and set(el["sha256"]) == set(el["files"])
    for f in el["files"]:  # every kept photo is named in the licence text, with its terms
        assert Path(f).stem in el["licence"], f
    assert "CC0 (public domain)" in el["licence"] and "Unsplash License" in el["licence"] and "Pexels License" in el["licence"]
    for left_out in ("Ashim DSilva", "Photo by SpaceX", "odin-dark", "Canazei Granite Ridges", "Nattu Adnan",
                     "leigh-kendell-581"):
        assert f"{left_out}.jpg" not in el["files"] and left_out in el["licence"]
    # the left-out Ashim D'Silva photo is the one deepin (a fold) has, by its Unsplash id
    assert "WeYamle9fDM" in el["licence"] and "ashim-d-silva-WeYamle9fDM-unsplash.jpg" in m["sources"]["deepin"]["files"]
    assert "noted before any figure" in el["licence"] and "elementary (9 photographs" in m["about"]
    assert "so it became a fold" in m["about"].split("elementary (9 photographs")[1]


def test_ubuntumate_was_scored_once_and_is_a_fold_now():
    """Ubuntu MATE's photo wallpapers (ubuntu-mate/ubuntu-mate-artwork at a pinned commit): 12 photographs by 12
    photographers, CC-BY-SA-4.0 or CC0 per file as the repository's debian/copyright states; blind for one session,
    scored once with the final fit, so spent; its terms allow fitting, so once a new blind source was found it became a
    fold. The space image, the generated mascot art, the photos with a logo laid on them and the all-bokeh abstract
    are left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    um = fc.corpus_sources(m)["ubuntumate"]
    _assert_scored_blind_once_then_a_fold(um)
    assert um["registry"] == "GitHub" and um["repo"] == "ubuntu-mate/ubuntu-mate-artwork"
    assert um["where"] == "usr/share/backgrounds/" and um["commit"] == "7d8984c302dfb328bbb7c67aada46277c4e5e7aa"
    assert len(um["files"]) == 12 and set(um["sha256"]) == set(um["files"])
    for f in um["files"]:  # every kept photo is named in the licence text
        assert Path(f).stem in um["licence"], f
    assert "CC-BY-SA-4.0" in um["licence"] and "CC0" in um["licence"]
    for left_out in ("sebastian-muller-52", "nasa-53884", "minotaur-king", "simplematetunnel", "honey-island"):
        assert not any(left_out in f for f in um["files"]) and left_out in um["licence"]
    # elementary's left-out Nattu Adnan photo (absent from its snapshot) may be this source's nattu-adnan-328570
    assert "Nattu Adnan.jpg" not in m["sources"]["elementary"]["files"]
    assert "noted before any figure" in um["licence"] and "ubuntumate (12 photographs" in m["about"]
    assert "so it became a fold" in m["about"].split("ubuntumate (12 photographs")[1]


def test_ubuntucinnamon_was_scored_once_and_is_a_fold_now():
    """Ubuntu Cinnamon's photo wallpapers (ubuntucinnamon/ubuntucinnamon-wallpapers at a pinned commit): 17 photographs
    by 12 photographers, at most two each by a rule fixed before anything was measured; CC0, CC BY-SA or GPL-3+ per
    file as its debian/copyright states; blind for one session, scored once with the final fit, so spent; its terms
    allow fitting, so once a new blind source was found it became a fold. The photo elementary has too, the black-and-white photos and the drawings
    are left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    uc = fc.corpus_sources(m)["ubuntucinnamon"]
    _assert_scored_blind_once_then_a_fold(uc)
    assert uc["registry"] == "GitHub" and uc["repo"] == "ubuntucinnamon/ubuntucinnamon-wallpapers"
    assert uc["where"] == "usr/share/backgrounds/ubuntucinnamon/"
    assert uc["commit"] == "53666004c504f2941ad2e2d1ee91ff8ea01b5824"
    assert len(uc["files"]) == 17 and set(uc["sha256"]) == set(uc["files"])
    for f in uc["files"]:  # every kept photo is named in the licence text by its release folder and title
        assert f.split("_by_")[0] in uc["licence"], f
    photographers = [Path(f).stem.split("_by_")[1] for f in uc["files"]]
    assert len(set(photographers)) == 12 and max(photographers.count(p) for p in photographers) == 2
    for left_out in ("Pink_Petaled_Flowers", "Half_Dome", "Harbour_Bridge", "Night_Otter", "Fantasy_Kudu"):
        assert not any(left_out in f for f in uc["files"]) and left_out in uc["licence"]
    assert "noted before any figure" in uc["licence"] and "ubuntucinnamon (17 photographs" in m["about"]
    assert "so it became a fold" in m["about"].split("ubuntucinnamon (17 photographs")[1]


def test_worksuite_was_scored_once_and_is_a_fold_now():
    """The Unsplash and Pexels photographs that languageseed/work_suite keeps for picking theme colours (pinned): 22
    photographs by 19 photographers, at most two each; Unsplash or Pexels License per file as its themes/images/
    LICENSE.md states. Blind for one session, scored once with the shipped fit, so spent; its terms allow fitting, so at
    the next refit it became a fold (the thirteenth). Renderings, a composite, photos and
    photographers other sources have, a sky-only Milky Way, a third photo of one photographer and the files the snapshot
    lacks are left out and named; the hard clean photos were noted before any figure; no other source shares its folder."""
    m = json.loads(fc.MANIFEST.read_text())
    ws = fc.corpus_sources(m)["worksuite"]
    _assert_scored_blind_once_then_a_fold(ws)
    assert ws["registry"] == "GitHub" and ws["repo"] == "languageseed/work_suite" and ws["where"] == "themes/images/"
    assert ws["commit"] == "f97665bbbf2c71edb7188f409ead1cbf77588ba2"
    assert len(ws["files"]) == 22 and set(ws["sha256"]) == set(ws["files"])
    for f in ws["files"]:  # every kept photo is named in the licence text, under its licence
        assert Path(f).stem in ws["licence"], f
        assert f.endswith("-unsplash.jpg") or f.startswith("pexels-"), f
    assert "Unsplash License" in ws["licence"] and "Pexels License" in ws["licence"]
    photographers = [f.split("-unsplash")[0].rsplit("-", 1)[0] if f.endswith("-unsplash.jpg")
                     else f.split("-")[1] for f in ws["files"]]
    assert len(set(photographers)) == 19 and max(photographers.count(p) for p in photographers) == 2
    # photos another source has (deepin's Ashim D'Silva, ubuntumate's Nattu Adnan wave) and a rendering are left out
    for left_out in ("ashim-d-silva-WeYamle9fDM", "nattu-adnan-Ai2TRdvI6gM", "maxim-berg-3E2xgrlNXq4", "mark-basarab"):
        assert not any(left_out in f for f in ws["files"]) and left_out in ws["licence"]
    assert "noted before any figure" in ws["licence"] and "worksuite (22 Unsplash and Pexels photographs" in m["about"]
    assert "so it became a fold" in m["about"].split("worksuite (22 Unsplash and Pexels photographs")[1]
    others = [s for name, s in m["sources"].items() if name != "worksuite"]
    assert not {(s.get("repo"), s.get("where")) for s in others} & {(ws["repo"], ws["where"])}


def test_qubes_and_trident_were_scored_once_and_are_folds_now():
    """QubesOS/qubes-artwork's Unsplash backgrounds and project-trident/trident-core's Pexels wallpapers (each pinned),
    8 photographs each, at most two per photographer, licence per file as each repository's README states: the blind
    sources for one session, in no fold and no fit; neither shares a photographer with another source (worksuite kept the
    Qubes photos it also has apart for this); the hard clean photos were noted before any figure. Scored once with the
    13-source fit, so spent; their terms allow fitting, so they became folds at the next refit (session 23)."""
    m = json.loads(fc.MANIFEST.read_text())
    training = fc.corpus_sources(m)
    qubes, trident = training["qubes"], training["trident"]
    for src in (qubes, trident):
        _assert_scored_blind_once_then_a_fold(src)
    assert (qubes["repo"], qubes["commit"], qubes["where"]) == (
        "QubesOS/qubes-artwork", "7ed30c8ce3af6a7330d2402dd874bab1fe863572", "backgrounds/")
    assert (trident["repo"], trident["commit"], trident["where"]) == (
        "project-trident/trident-core", "0a24d023a82769c085ecc83f9789e7d0be4278bc", "void-desktop-files/usr/share/wallpapers/")
    assert all(f.endswith("-unsplash.jpg") for f in qubes["files"]) and "Unsplash License" in qubes["licence"]
    assert all(f.split("/")[0] in ("trident-nature", "trident-space") for f in trident["files"])
    assert "Pexels" in trident["licence"]
    for src in (qubes, trident):
        assert src["registry"] == "GitHub" and len(src["files"]) == 8 and set(src["sha256"]) == set(src["files"])
        assert len({Path(f).stem for f in src["files"]}) == 8  # working copies are named by stem
        assert "before any figure" in src["licence"] and "night" in src["licence"]
        for f in src["files"]:
            assert Path(f).stem.rsplit("-", 1)[0] in src["licence"] or Path(f).stem in src["licence"], f
    # the two Qubes photos worksuite's folder also has were kept apart there for this source
    assert "benjamin-voros-phIFdC6lA4E-unsplash.jpg" in qubes["files"] and "benjamin-voros-phIFdC6lA4E" in m["sources"]["worksuite"]["licence"]
    assert "qubes (8 Unsplash photographs" in m["about"] and "trident (8 Pexels photographs" in m["about"]
    assert "so they became folds" in m["about"].split("trident (8 Pexels photographs")[1]


def _assert_pinned_photo_entry(src, pinned, n_files, left_out=(), licence_name=lambda f: Path(f).stem):
    """A manifest entry of photos at a pinned commit: its repo, commit and folder; `n_files` files, each with a SHA-256
    and a unique stem (working copies are named by stem), each named in the licence text (by its stem, or as
    `licence_name` gives it); the expectations written before scoring; and each `left_out` name absent from the files
    but named in the licence text."""
    assert (src["repo"], src["commit"], src["where"]) == pinned
    assert len(src["files"]) == n_files and set(src["sha256"]) == set(src["files"])
    assert len({Path(f).stem for f in src["files"]}) == n_files
    names = [licence_name(f) for f in src["files"]]
    for name in names:
        assert name in src["licence"], name
    assert "Expected before scoring" in src["licence"]
    for name in left_out:
        assert name not in names and name in src["licence"], name


def test_endless_was_scored_once_and_is_a_fold_now():
    """Endless OS's default wallpapers (endlessm/eos-media at a pinned commit): 11 photographs by 11 photographers, the
    licence of each file (CC0, CC BY 2.0, CC BY-SA 2.0 or the Unsplash License) as the repository's LICENSE.tsv states;
    the blind source after qubes and trident, scored once with the 13-source fit, so spent (its terms allow fitting:
    a fold since the next refit, session 23); no photographer, account or photo id shared with another source;
    the photos named by an id only, the renderings, the space images, the no-derivatives and unclear licences, the
    black-and-white photos and deepin's canyon are left out and named; the hard clean photos (and three strongly compressed files) were noted
    before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    endless = fc.corpus_sources(m)["endless"]
    _assert_scored_blind_once_then_a_fold(endless)
    assert endless["registry"] == "GitHub"
    _assert_pinned_photo_entry(endless, ("endlessm/eos-media", "3f42869c4d20fe1343a43974ec1d3f2a0685ba3a",
                                         "default_files/default_images/"), 11,
                               left_out=("Canyon", "Colour_Tiles"))  # deepin's photo; a photographer ubuntumate has
    assert "LICENSE.tsv" in endless["licence"]


def test_xubuntu_was_scored_once_and_is_a_fold_now():
    """The Xubuntu community wallpapers (Xubuntu/xubuntu-community-artwork at a pinned commit, the contest winners of
    2014-2022): 26 photographs by 24 photographers, at most two per photographer, the licence of each file (CC0, CC BY
    3.0, CC BY 4.0 or CC BY-SA 3.0) as the repository's debian/copyright states; scored once with the 16-source fit,
    so spent (its terms allow fitting: a fold since the next refit, session 24); no photographer shared with another
    source; the third photo of one photographer, a star-sky photo and the files absent from the snapshot are left out
    and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    xubuntu = fc.corpus_sources(m)["xubuntu"]
    _assert_scored_blind_once_then_a_fold(xubuntu, github_fit=16)
    _assert_pinned_photo_entry(xubuntu, ("Xubuntu/xubuntu-community-artwork", "d23e0971701bbacab102cbcd17ca8cd4ad471f04",
                                         "usr/share/xfce4/backdrops/"), 26,
                               left_out=("Untitled_7019_by_Mike_Sinko", "jeff_morgan__stub_stewart_iridium_flare__4k",
                                         "Dolomites_by_Felix_Hartlieb"))
    assert "debian/copyright" in xubuntu["licence"]
    assert "so it became a fold" in m["about"].split("xubuntu (26 photographs")[1].split("ubuntu (15 photographs")[0]


def test_ubuntu_was_scored_once_and_is_a_fold_now():
    """Ubuntu's community wallpaper contest winners of 2019-2022 (the ubuntu-wallpapers source package, from its git
    import at a pinned commit, files at the tree root): 15 photographs by 13 photographers, at most two each, all
    CC BY-SA 4.0 as the package's debian/copyright states; scored once with the 17-source fit, so spent (its terms
    allow fitting: a fold since the next refit, session 25); no photographer shared with another source; xubuntu's
    photo that the contest also has, the renderings, night skies and the files absent from the snapshot are left out
    and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    ubuntu = fc.corpus_sources(m)["ubuntu"]
    _assert_scored_blind_once_then_a_fold(ubuntu, github_fit=17)
    _assert_pinned_photo_entry(ubuntu, ("twinysam/ubuntu-wallpapers", "443676508be148b0d4529a0bd79345f114e2cca4", ""), 15,
                               left_out=("DSC2943_by_kcpru", "Milky_Way_by_Paulo_José_Oliveira_Amaro",
                                         "Way_by_Kacper_Ślusarczyk"))
    assert "debian/copyright" in ubuntu["licence"] and "CC-BY-SA-4.0" in ubuntu["licence"]
    photographers = [Path(f).stem.rsplit("_by_", 1)[1] for f in ubuntu["files"]]
    assert len(set(photographers)) == 13 and max(photographers.count(p) for p in photographers) == 2
    assert "so it became a fold" in m["about"].split("ubuntu (15 photographs")[1].split("fedora30 (7 photographs")[0]


def test_fedora30_and_fedora31_were_scored_once_side_by_side_and_are_folds_now():
    """Fedora's supplemental wallpapers of releases 30 and 31 (fedoradesign/backgrounds extras/, each at the last commit
    that holds its set): 7 and 9 photographs, at most two per photographer, CC0 or CC BY-SA 4.0 per file as each
    commit's Attribution-Extras states; two blind sources scored once side by side with the 18-source fit, as qubes
    and trident were (too few photos each to stand alone), so spent (their terms allow fitting: folds since the next
    refit, session 25); no photographer shared with another source or with each other; the files absent
    from the snapshot, the astro composite, the black-and-white photos and the drawing are left out and named; the hard
    clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    training = fc.corpus_sources(m)
    f30, f31 = training["fedora30"], training["fedora31"]
    _assert_pinned_photo_entry(f30, ("fedoradesign/backgrounds", "1aacd09dafab12cf72e603f0a30964af7baa9ee5", "extras/"), 7,
                               left_out=("great-oak-in-claremont", "lonely-tree-in-kenya", "i-see-stars", "wheat"))
    _assert_pinned_photo_entry(f31, ("fedoradesign/backgrounds", "fc5d91c5007272a302d0081c85db5d8e72529e3d", "extras/"), 9,
                               left_out=("galactic-mountains", "autumn", "metro"))
    for src, other in ((f30, "fedora31"), (f31, "fedora30")):
        assert src["registry"] == "GitHub" and "Attribution-Extras" in src["licence"]
        assert "CC0 1.0" in src["licence"] and "before any photo" in src["licence"]
        _assert_scored_blind_once_then_a_fold(src)
        assert f"side by side with {other}, with the shipped 18-source fit" in src["spent"]
    # the two sets share no file and no photo: working copies are named by source and stem
    assert not {Path(f).stem for f in f30["files"]} & {Path(f).stem for f in f31["files"]}
    assert not set(f30["sha256"].values()) & set(f31["sha256"].values())
    assert "so they became folds" in m["about"].split("fedora31 (9 photographs")[1].split("joelazar (22")[0]


def test_joelazar_was_scored_once_and_is_a_fold_now():
    """One person's collection of Unsplash wallpapers (joelazar/wallpapers unsplash/ at a pinned commit): 22 photographs
    by 21 photographers, at most two each, the Unsplash License as the repository's README states (no licence file:
    the files are Unsplash's own downloads, named by photographer and photo id); scored once with the 20-source fit,
    so spent (its terms allow fitting: a fold since the next refit, session 25); no photographer or photo id shared
    with another source; the files absent from the snapshot, the photographers other sources have and a night sky are
    left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    joe = fc.corpus_sources(m)["joelazar"]
    _assert_scored_blind_once_then_a_fold(joe, github_fit=20)
    assert all(f.endswith("-unsplash.jpg") for f in joe["files"])

    def unsplash_id(f):  # <photographer>-<photo id>, as the licence names the file
        return f.removesuffix("-unsplash.jpg")

    _assert_pinned_photo_entry(joe, ("joelazar/wallpapers", "b7af7759b68455f43b236a0be20508ed6cd38b90", "unsplash/"), 22,
                               left_out=("lucian-dachman-qxO2PBn7eKU", "bailey-zindel-NRQV-hBF10M",
                                         "cosmic-timetraveler-LhDWW8PhPoE", "casey-horner-rtCujH697DU"),
                               licence_name=unsplash_id)
    assert joe["licence"].startswith("Unsplash License") and "README.md" in joe["licence"]
    ids = [unsplash_id(f) for f in joe["files"]]
    # the Unsplash photo id is the last 11 characters; no photo id is in another source's file names
    others = " ".join(f for name, src in m["sources"].items() if name != "joelazar" for f in src["files"])
    assert not [i for i in ids if i[-11:] in others]
    assert "so it became a fold" in m["about"].split("joelazar (22 Unsplash photographs")[1].split("gbcwiki (18")[0]


def test_gbcwiki_was_scored_once_then_became_a_fold():
    """The Wikimedia Commons photos that Apple's graph-based captioning code keeps as sample inputs (apple/ml-gbc
    data/images/wiki/ at a pinned commit): 18 photographs, the licence of each (CC BY-SA, the Free Art License, CC0 or
    public domain) and its Commons page as that folder's README states; scored once with the 21-source fit, then (its
    terms allow fitting) a fold; the three paintings are left out and named; the hard clean photos were noted before
    any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    gbc = fc.corpus_sources(m)["gbcwiki"]
    _assert_scored_blind_once_then_a_fold(gbc, github_fit=21)
    _assert_pinned_photo_entry(gbc, ("apple/ml-gbc", "b66c03c89aa5744f9e772ad074a8535ceb2b1f63", "data/images/wiki/"), 18,
                               left_out=("Jean-Francois_Portaels", "Kompoziciya", "Painting"))
    assert "Wikimedia Commons" in gbc["licence"] and "Free Art License" in gbc["licence"]
    assert "so it became a fold" in m["about"].split("gbcwiki (18 Wikimedia Commons photographs")[1].split("placecal (14")[0]


def test_placecal_was_scored_once_then_became_a_fold():
    """The Unsplash photos the PlaceCal community calendar ships as seed pictures (geeksforsocialchange/PlaceCal
    db/seeds/images/ at a pinned commit, in two subfolders): 14 photographs by 14 photographers, the Unsplash License
    per file as that folder's LICENSE.md states; scored once with the 22-source fit, then (its terms allow fitting) a
    fold; the avatars (under 512 px) are left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    pc = fc.corpus_sources(m)["placecal"]
    _assert_scored_blind_once_then_a_fold(pc, github_fit=22)
    _assert_pinned_photo_entry(pc, ("geeksforsocialchange/PlaceCal", "e142f103fae331a2c3ae5cc10451fd8c8f0f2778",
                                    "db/seeds/images/"), 14)
    assert {f.split("/")[0] for f in pc["files"]} == {"partners", "sites"}  # a file's stem names its working copy
    assert "LICENSE.md" in pc["licence"] and "Unsplash License" in pc["licence"] and "avatar" in pc["licence"]
    assert "so it became a fold" in m["about"].split("placecal (14 Unsplash photographs")[1].split("kirby (35")[0]


def test_kirby_was_scored_once_then_became_a_fold():
    """The Unsplash photos the Kirby CMS Starterkit keeps as demo content (getkirby/starterkit content/1_photography/
    at a pinned commit, one subfolder per album): 35 photographs by 32 photographers, at most two each, the Unsplash
    License per file as each photo's metadata file states; scored once with the 23-source fit, then (its terms allow
    fitting) a fold; the photographers other sources have, mate's stem, the sky-only astro images, the uncredited file
    and a third photo of one photographer are left out and named; the hard clean photos were noted before any
    figure."""
    m = json.loads(fc.MANIFEST.read_text())
    kirby = fc.corpus_sources(m)["kirby"]
    _assert_scored_blind_once_then_a_fold(kirby, github_fit=23)
    _assert_pinned_photo_entry(kirby, ("getkirby/starterkit", "a2590d4b6bfd3396fa514390c4da634a68fd7ecf",
                                       "content/1_photography/"), 35,
                               left_out=("probably-photoshopped",  # ubuntucinnamon's Brown_Mountains, same photo
                                         "dune",  # mate has Dune.jpg: stems must not collide, whatever the case
                                         "blood-moon", "area-51", "less-water-than-last-year", "no-idea-what-that-is"))
    assert "Unsplash License" in kirby["licence"] and ".jpg.txt" in kirby["licence"]
    assert "so it became a fold" in m["about"].split("kirby (35 Unsplash photographs")[1].split("photostream (33")[0]


def test_photostream_was_scored_once_then_became_a_fold():
    """The Unsplash photos a photo-stream website template keeps as its demo (Cecilapp/photo-stream static/photos/ at
    a pinned commit): 33 photographs by 33 photographers, the Unsplash License as its README states, each file under
    its Unsplash download name (photographer and photo id); scored once with the 24-source fit, then (its terms
    allow fitting) a fold; the files missing from the snapshot, placecal's photo and the archive account's photo are
    left out and named; the hard clean photos were noted before any figure."""
    m = json.loads(fc.MANIFEST.read_text())
    ps = fc.corpus_sources(m)["photostream"]
    _assert_scored_blind_once_then_a_fold(ps, github_fit=24)
    _assert_pinned_photo_entry(ps, ("Cecilapp/photo-stream", "8a7cf1f6ff34bd95ae43f9f98628c6e79114a9ed",
                                    "static/photos/"), 33,
                               left_out=("federico-respini-sYffw0LNr7s-unsplash",  # placecal's ashdale_hero
                                         "library-of-congress-bd-9CtgkOIk-unsplash"))
    assert all(f.endswith("-unsplash.jpg") for f in ps["files"])
    assert "Unsplash License" in ps["licence"] and "README.md" in ps["licence"]
    # the Unsplash photo id (the last 11 characters before "-unsplash") is in no other source's entry
    others = json.dumps({name: src for name, src in m["sources"].items() if name != "photostream"})
    assert not [f for f in ps["files"] if f.removesuffix("-unsplash.jpg")[-11:] in others]
    assert "so it became a fold" in m["about"].split("photostream (33 Unsplash photographs")[1].split("Research-only")[0]


def test_kodak_is_a_fold_now():
    """Kodak24 was scored blind once and is spent: a leave-one-source-out source (budgie and the later blind sources
    whose terms allow fitting, too)."""
    m = json.loads(fc.MANIFEST.read_text())
    training, blind = fc.corpus_sources(m), fc.corpus_sources(m, blind=True)
    assert set(training) == {"skimage", "mate", "plasma", "lomiri", "kodak", "budgie", "deepin", "solus", "popos",
                             "elementary", "ubuntumate", "ubuntucinnamon", "worksuite", "qubes", "trident", "endless",
                             "xubuntu", "ubuntu", "fedora30", "fedora31", "joelazar", "gbcwiki",
                             "placecal", "kirby", "photostream"}
    # pyiqa's calibration photos are TID2013's references, i.e. Kodak photos again: not a source of their own
    assert not any("ResultsCalibra" in src["where"] for src in m["sources"].values())
    assert set(blind) == {"cbsd68", "mcmaster", "urban100"}
    assert m["sources"]["kodak"]["blind"] is False and len(training["kodak"]["files"]) == 24


@pytest.mark.parametrize("type_name", sorted(synth.TYPES))
def test_alt_ladder_is_new_values_in_the_same_order(type_name):
    t = synth.TYPES[type_name]
    fit = [fc.ladder_param(t, lv, "fit") for lv in range(1, 6)]
    alt = [fc.ladder_param(t, lv, "alt") for lv in range(1, 6)]
    assert fit == list(t.params)
    assert len(set(alt)) == 5 and any(a != f for a, f in zip(alt, fit))
    increasing = t.params[1] > t.params[0]
    assert alt == sorted(alt, reverse=not increasing)


def test_working_copy_downscales_only(tmp_path):
    big = tmp_path / "big.png"
    Image.fromarray(np.full((900, 1200, 3), 128, np.uint8)).save(big)
    x = fc.working_copy(big, 512)
    assert x.shape == (384, 512, 3) and x.dtype == np.float32 and abs(float(x.mean()) - 128 / 255) < 1e-3
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((101, 150, 3), np.uint8)).save(small)
    assert fc.working_copy(small, 512).shape == (100, 150, 3)  # never upscaled; even sizes


def test_clean_offsets_are_measured_on_sources_left_out():
    from agentic_iqa.bench.synth import distort, load_reference

    samples, sources = [], []
    for src, ref in (("a", "astronaut"), ("b", "chelsea"), ("c", "coffee")):
        x = load_reference(ref)[::2, ::2]
        from agentic_iqa.offline import stats as st

        base = st.measure(x)
        samples.append(({**base, **st.measure_fr(x, x, base, base)}, None, 0))
        sources.append(src)
        for lv in (2, 4):
            y = distort(x, "gaussian blur", lv)
            nr = st.measure(y)
            samples.append(({**nr, **st.measure_fr(y, x, nr, base)}, "gaussian blur", lv))
            sources.append(src)
    th = sv.fit_with_clean_offsets(samples, sources)
    assert all(0.0 <= th[m][d.name]["clean_offset"] <= 2.5 for m in ("nr", "fr") for d in sv.DETECTORS)
    # The positives-only blend is for the no-reference levels only; FR keeps its shrunk maps.
    assert all(th["nr"][d.name]["pos_ramp"] == list(sv.POS_RAMP) and "pos_ramp" not in th["fr"][d.name]
               for d in sv.DETECTORS)
    single = sv.fit_with_clean_offsets(samples, ["a"] * len(samples))  # one source: nothing held out
    assert all(single["nr"][d.name]["clean_offset"] == 0.0 for d in sv.DETECTORS)
    # The nested folds fit on a subset of one FittingSamples (feature values computed once): the same fit as on
    # that subset's own list.
    keep = np.array([src != "b" for src in sources])
    assert sv.fit_all(sv.FittingSamples(samples), subset=keep) == sv.fit_all([s for s, k in zip(samples, keep) if k])
    # Those nested fits read only each detector's map (``_mapped_level``), so they fit nothing else: the map fields
    # of a maps-only fit are the full fit's, and every clean sample's mapped level is the same.
    full, maps = (sv.fit_all(sv.FittingSamples(samples), subset=keep, maps_only=only) for only in (False, True))
    map_fields = {"features", "mean", "std", "coef", "intercept", "knots_x", "knots_y", "rmse"}
    for mode in ("nr", "fr"):
        for d in sv.DETECTORS:
            assert set(maps[mode][d.name]) == map_fields and "discount" not in maps[mode][d.name]
            assert {k: full[mode][d.name][k] for k in map_fields} == maps[mode][d.name]
            for st_, t, _ in samples:
                st_ = st_ if mode == "fr" else sv._nr_only(st_)
                assert sv._mapped_level(maps[mode][d.name], st_) == sv._mapped_level(full[mode][d.name], st_)
    # Folds fitted in worker processes are the folds fitted one by one.
    photos = [{"source": src, "name": f"{src}{i}"} for i, src in enumerate(sources) if samples[i][1] is None]
    measured = []
    for ph in photos:
        rows = [smp for smp, src in zip(samples, sources) if src == ph["source"]]
        split = lambda st_: {"nr": {k: v for k, v in st_.items() if not k.startswith("fr_")},  # noqa: E731
                             "fr": {k: v for k, v in st_.items() if k.startswith("fr_")}}
        measured.append({"clean": split(rows[0][0]),
                         "rows": [{"ladder": "fit", "type": t, "level": lv, **split(st_)} for st_, t, lv in rows[1:]]})
    left_out = [("a",), ("b",), ("a", "c")]
    assert fc.fits_without(photos, measured, left_out, workers=2) == fc.fits_without(photos, measured, left_out)


# ------------------------------------------------------------------------------------ blind sources

def _fake_photo_files(tmp_path, monkeypatch):
    """Every manifest file resolves to one small local image: no package is fetched."""
    img = tmp_path / "photo.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(img)
    monkeypatch.setattr(fc, "_locate", lambda cache, src, name: img)


def test_manifest_has_a_blind_source_with_licences():
    m = json.loads(fc.MANIFEST.read_text())
    blind = fc.corpus_sources(m, blind=True)
    assert len(blind) >= 1 and sum(len(s["files"]) for s in blind.values()) >= 8
    for name, src in blind.items():
        assert src["blind"] is True and src["registry"] in ("PyPI", "Debian", "GitHub") and src["licence"], name
    training = fc.corpus_sources(m)
    assert len(training) >= 4 and not set(training) & set(blind)
    assert set(training) | set(blind) == set(m["sources"])


def test_blind_sources_never_enter_the_corpus_folds_or_fit(tmp_path, monkeypatch):
    _fake_photo_files(tmp_path, monkeypatch)
    blind = {n for n, s in json.loads(fc.MANIFEST.read_text())["sources"].items() if s.get("blind")}
    assert blind and fc.blind_source_names() == blind
    photos = fc.build_corpus(tmp_path / "cache", 64)  # what the LOSO folds, the final fit and choose_fusion use
    assert photos and not {p["source"] for p in photos} & blind and not any(p["blind"] for p in photos)
    hidden = fc.build_corpus(tmp_path / "cache", 64, blind=True)
    assert hidden and {p["source"] for p in hidden} == blind and all(p["blind"] for p in hidden)
    # their working copies live apart from the training ones (a glob of work/64 never finds them)
    assert not {Path(p["path"]).parent for p in photos} & {Path(p["path"]).parent for p in hidden}
    # a fold or fit handed a blind photo (even one without the flag) refuses before measuring anything
    stray = [{**hidden[0], "blind": False}]
    for call in (lambda: fc.fit(photos + stray, []), lambda: fc.loso(photos + stray, []),
                 lambda: fc.samples_of(stray, [])):
        with pytest.raises(ValueError, match="blind source"):
            call()


def test_blind_report_refuses_a_fit_that_saw_a_blind_source(tmp_path, monkeypatch):
    _fake_photo_files(tmp_path, monkeypatch)
    th = json.loads(sv.THRESHOLDS_PATH.read_text())
    assert not set(th["provenance"]["sources"]) & fc.blind_source_names()  # the shipped fit is blind to them
    th["provenance"]["sources"] = sorted({*th["provenance"]["sources"], *fc.blind_source_names()})
    bad = tmp_path / "thresholds.json"
    bad.write_text(json.dumps(th))
    with pytest.raises(ValueError, match="fitted on blind source"):
        fc.blind_report(tmp_path / "cache", 64, bad, 1)


def test_blind_report_scores_each_source_on_its_own_with_its_status(tmp_path, monkeypatch, capsys):
    """A spent source's figures must not pool into the blind one's: each is evaluated on its own photos only."""
    _fake_photo_files(tmp_path, monkeypatch)
    monkeypatch.setattr(fc, "measure_corpus", lambda photos, *a: [{"name": p["name"]} for p in photos])
    seen = []

    def evaluate(photos, measured, th, ladder):
        assert [p["name"] for p in photos] == [m["name"] for m in measured]
        seen.append(({p["source"] for p in photos}, ladder))
        figures = {"intra_srcc": 0.9, "all_srcc": 0.7, "top1_l35": 0.8, "clean_mean": 4.0, "clean_below_3_5": 0.1}
        return {"n": len(photos), "nr": figures, "fr": figures}

    monkeypatch.setattr(fc, "evaluate", evaluate)
    report = fc.blind_report(tmp_path / "cache", 64, sv.THRESHOLDS_PATH, 1)
    m = json.loads(fc.MANIFEST.read_text())
    for name, src in fc.corpus_sources(m, blind=True).items():
        got = report["sources"][name]
        assert got["status"] == fc.blind_status(src) and got["n_photos"] == len(src["files"])
        assert all(got[lad]["n"] == len(src["files"]) for lad in fc.LADDERS)
    assert all(len(sources) == 1 for sources, _ in seen) and len(seen) == 2 * len(report["sources"])
    assert [report["sources"][s]["status"] for s in ("cbsd68", "mcmaster", "urban100")] == ["spent"] * 3
    # the command prints one line per source and ladder, labelled with its status, and writes the per-source report
    out = tmp_path / "blind.json"
    assert fc.main(["--blind-report", "--cache", str(tmp_path / "cache"), "--size", "64", "--blind-json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cbsd68 (spent, 68 photos), alt ladder" in printed and "mcmaster (spent, 18 photos), fit ladder" in printed
    assert "urban100 (spent, 93 photos), fit ladder" in printed and "budgie" not in printed
    assert "worksuite" not in printed and "ubuntucinnamon" not in printed
    assert "qubes" not in printed and "trident" not in printed and "endless" not in printed  # folds now
    assert "ubuntu" not in printed  # xubuntu and ubuntu are folds now
    assert "fedora" not in printed  # folds now
    assert "joelazar" not in printed and "gbcwiki" not in printed  # folds now
    assert "placecal" not in printed and "kirby" not in printed and "photostream" not in printed  # folds now
    assert set(json.loads(out.read_text())["sources"]) == {"cbsd68", "mcmaster", "urban100"}
    # --blind-source scores the named source alone (the spent ones are not measured again); a wrong name is refused
    seen.clear()
    assert fc.main(["--blind-report", "--cache", str(tmp_path / "cache"), "--size", "64", "--blind-json", str(out),
                    "--blind-source", "urban100", "--blind-source", "mcmaster"]) == 0
    assert set(json.loads(out.read_text())["sources"]) == {"urban100", "mcmaster"}
    assert {s for src, _ in seen for s in src} == {"urban100", "mcmaster"}
    capsys.readouterr()
    assert fc.main(["--blind-report", "--cache", str(tmp_path / "cache"), "--size", "64", "--blind-json", str(out),
                    "--blind-source", "worksuite"]) == 2
    assert ("not a blind source: worksuite; the blind sources are cbsd68, mcmaster, urban100"
            in capsys.readouterr().err)


# ------------------------------------------------------------------------------------ GitHub sources

def test_github_photos_are_downloaded_once_and_checked_by_sha256(tmp_path, monkeypatch):
    import hashlib
    import http.server
    import threading

    served = tmp_path / "srv" / "owner/repo/abc123/sets/"
    served.mkdir(parents=True)
    good = (served / "a.png")
    Image.fromarray(np.full((8, 8, 3), 100, np.uint8)).save(good)
    (served / "big.png").write_bytes(b"x" * 4096)
    (served / "exhibición.png").write_bytes(good.read_bytes())  # a non-ASCII name (solus) is quoted in the URL
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "srv"), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(fc, "GITHUB_RAW", f"http://127.0.0.1:{server.server_address[1]}")
        src = {"registry": "GitHub", "repo": "owner/repo", "commit": "abc123", "where": "sets/",
               "sha256": {"a.png": hashlib.sha256(good.read_bytes()).hexdigest(), "big.png": "0" * 64,
                          "exhibición.png": hashlib.sha256(good.read_bytes()).hexdigest(),
                          "gone.png": "0" * 64}}
        cache = tmp_path / "cache"
        got = fc._locate(cache, src, "a.png")
        assert got.read_bytes() == good.read_bytes() and got.is_relative_to(cache)
        assert fc._locate(cache, src, "exhibición.png").read_bytes() == good.read_bytes()
        good.unlink()  # the second call uses the cached copy, no download
        assert fc._locate(cache, src, "a.png") == got
        got.write_bytes(got.read_bytes() + b"tampered")
        with pytest.raises(RuntimeError, match="SHA-256"):
            fc._locate(cache, src, "a.png")
        monkeypatch.setattr(fc, "GITHUB_FILE_MAX", 1024)
        with pytest.raises(RuntimeError, match="larger than 1024 bytes"):
            fc._locate(cache, src, "big.png")
        with pytest.raises(RuntimeError, match="cannot download .*put the file at"):
            fc._locate(cache, src, "gone.png")
    finally:
        server.shutdown()


def test_fetch_only_writes_working_copies_and_measures_nothing(tmp_path, monkeypatch, capsys):
    _fake_photo_files(tmp_path, monkeypatch)

    def no_measuring(*a, **k):
        raise AssertionError("--fetch-only measured something")

    monkeypatch.setattr(fc, "measure_corpus", no_measuring)
    monkeypatch.setattr(fc, "evaluate", no_measuring)
    cache = tmp_path / "cache"
    assert fc.main(["--fetch-only", "--cache", str(cache), "--size", "64", "--json", str(tmp_path / "loso.json"),
                    "--out", str(tmp_path / "th.json"), "--blind-json", str(tmp_path / "blind.json")]) == 0
    m = json.loads(fc.MANIFEST.read_text())
    for blind, folder in ((False, "64"), (True, "blind-64")):
        want = {f"{name}__{Path(f).stem}.png" for name, src in fc.corpus_sources(m, blind).items() for f in src["files"]}
        assert {p.name for p in (cache / "work" / folder).iterdir()} == want
    assert not (cache / "stats").exists() and not list(tmp_path.glob("*.json"))
    out = capsys.readouterr().out
    n_blind = sum(len(src["files"]) for src in fc.corpus_sources(m, blind=True).values())
    assert f"blind: {n_blind} photos" in out and "grayscale: none" in out


def test_question_benchmark_keys_come_from_the_applied_damage_only():
    import question_accuracy as qa

    blurry, sharp = "Is the image blurry? A. Yes B. No", "Is the image sharp? A. Yes B. No"
    assert qa.key(blurry, "lens blur", 3) is True and qa.key(sharp, "lens blur", 3) is False
    assert qa.key(blurry, None, 0) is False and qa.key(sharp, None, 0) is True
    assert qa.key(blurry, "white noise", 5) is False
    assert qa.key(blurry, "jpeg2000", 5) is None          # the same symptom: not scored
    assert qa.key(blurry, "gaussian blur", 2) is None     # levels 1-2 may not be visible
    good, degraded = "Is the image of good quality? A. Yes B. No", "Is this image degraded? A. Yes B. No"
    assert (qa.key(good, None, 0), qa.key(good, "darken", 4), qa.key(good, "darken", 3)) == (True, False, None)
    assert (qa.key(degraded, None, 0), qa.key(degraded, "jpeg", 5)) == (False, True)
    # Every question's damage is a benchmark type, so no key silently never says Yes.
    assert all(asks <= set(synth.TYPES) and lookalike <= set(synth.TYPES)
               for asks, lookalike, _ in qa.DISTORTION_QUESTIONS.values())


def test_question_blind_report_asks_the_named_blind_source_only(tmp_path, monkeypatch, capsys):
    import question_accuracy as qa

    _fake_photo_files(tmp_path, monkeypatch)
    monkeypatch.setattr(fc, "measure_corpus", lambda photos, *a: [{"name": p["name"]} for p in photos])
    asked = []
    monkeypatch.setattr(qa, "ask_fold", lambda photos, measured, th: asked.append({p["source"] for p in photos}) or [])
    monkeypatch.setattr(qa, "summarize", lambda rows, folds: {"nr": {}, "fr": {}})
    out = tmp_path / "q.json"
    argv = ["--blind-report", "--cache", str(tmp_path / "cache"), "--size", "64", "--json", str(out)]
    assert qa.main([*argv, "--blind-source", "urban100"]) == 0
    assert asked == [{"urban100"}] and set(json.loads(out.read_text())["sources"]) == {"urban100"}
    assert qa.main([*argv, "--blind-source", "kodak"]) == 2
    assert "not a blind source: kodak" in capsys.readouterr().err


def test_statistics_cache_measures_only_the_damage_types_that_changed(tmp_path, monkeypatch):
    photo = tmp_path / "src__p.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(photo)
    calls = []
    real_measure = fc.st.measure
    monkeypatch.setattr(fc.st, "measure", lambda x: calls.append(1) or real_measure(x))
    types = dict(synth.TYPES)
    monkeypatch.setattr(synth, "TYPES", {n: types[n] for n in ("darken", "white noise")})
    job = (str(photo), False, fc._code_key(), str(tmp_path))

    first = fc.measure_photo(job)
    assert len(calls) == 1 + 2 * 10  # the clean photo, 2 types x 5 levels x 2 ladders
    assert [(r["ladder"], r["type"]) for r in first["rows"][::5]] == [
        ("fit", "darken"), ("fit", "white noise"), ("alt", "darken"), ("alt", "white noise")]
    calls.clear()
    assert fc.measure_photo(job) == first and not calls  # all cached

    # One type's ladder changes and one is added: only those two are measured, the other's rows are kept.
    darker = synth.DistortionType("darken", synth.darken, (1.3, 1.6, 2.0, 2.6, 3.4), "gamma > 1")
    monkeypatch.setattr(synth, "TYPES", {"darken": darker, "white noise": types["white noise"],
                                         "overexposure": types["overexposure"]})
    again = fc.measure_photo(job)
    assert len(calls) == 2 * 10
    noise = [r for r in again["rows"] if r["type"] == "white noise"]
    assert noise == [r for r in first["rows"] if r["type"] == "white noise"]
    assert [r for r in again["rows"] if r["type"] == "darken"] != [r for r in first["rows"] if r["type"] == "darken"]


def test_recipe_key_follows_the_synth_helpers_a_type_calls(monkeypatch):
    contrast = synth.TYPES["contrast decrease"]  # calls synth._luma
    before = fc._recipe_key(contrast), fc._recipe_key(synth.TYPES["darken"])
    monkeypatch.setattr(synth, "_luma", lambda x: x.mean(axis=2))
    assert fc._recipe_key(contrast) != before[0] and fc._recipe_key(synth.TYPES["darken"]) == before[1]


def test_mixed_damage_pairs_stand_beside_their_parts_alone(tmp_path, monkeypatch):
    """benchmarks/mixed_damage.py compares each blur-under-noise pair with its two parts alone, read from the statistics
    cache: each part must be the very damage the cache measured (same ladder, parameter and random draws)."""
    import mixed_damage as md

    photo = tmp_path / "src__p.png"
    Image.fromarray((synth.load_reference("chelsea", (96, 64)) * 255).astype(np.uint8)).save(photo)
    types = dict(synth.TYPES)
    monkeypatch.setattr(synth, "TYPES", {n: types[n] for n in ("gaussian blur", "white noise")})
    monkeypatch.setattr(md, "BLURS", ("gaussian blur",))
    monkeypatch.setattr(md, "NOISES", ("white noise",))
    cached = fc.measure_photo((str(photo), False, fc._code_key(), str(tmp_path)))
    x = np.asarray(Image.open(photo).convert("RGB"), dtype=np.float32) / 255
    alt = {(r["type"], r["level"]): r["nr"] for r in cached["rows"] if r["ladder"] == "alt"}
    for level in md.LEVELS:
        blurred = md._damaged(x, photo.stem, "gaussian blur", level)
        assert fc.st.measure(blurred) == alt[("gaussian blur", level)]
        assert fc.st.measure(md._damaged(x, photo.stem, "white noise", level)) == alt[("white noise", level)]

    pairs = md.measure_pairs(str(photo))
    assert sorted(pairs) == [f"gaussian blur|white noise|{lv}" for lv in md.LEVELS]
    rows = md.score_photo(cached, pairs, sv.load_thresholds())
    for r in rows:
        assert r["below_both"] == (r["score"] < min(r["blur_alone"], r["noise_alone"]))
    summary = md.summarize(rows)
    assert summary["all"]["n"] == 3 and summary["all"]["noise_named"] == np.mean([r["noise_named"] for r in rows])


def test_region_questions_damage_one_half_and_ask_of_both(tmp_path, monkeypatch):
    """benchmarks/region_questions.py damages one half of the frame (the rest untouched, with the draws of the
    corpus's single damage) and keys the damaged half Yes, the other half No; the whole-image answer is one answer
    for both halves."""
    import region_questions as rq

    photo = tmp_path / "src__p.png"
    x = synth.load_reference("chelsea", (384, 256))
    Image.fromarray((x * 255).astype(np.uint8)).save(photo)
    monkeypatch.setattr(rq, "QUESTIONS", {t: rq.QUESTIONS[t] for t in ("gaussian blur", "white noise")})
    monkeypatch.setattr(rq, "LEVELS", (4,))
    measured = rq.measure_photo((str(photo), 0))
    half, stats = measured["gaussian blur|4"]
    assert half == rq._which_half("gaussian blur", 4, 0) and set(stats) == {"whole", *rq.HALVES}
    x8 = np.asarray(Image.open(photo).convert("RGB"), dtype=np.float32) / 255
    damaged = rq._half_damaged(x8, np.zeros_like(x8), half)
    inside = damaged[rq.frame_part(half).slices(*x8.shape[:2])]
    assert not inside.any() and damaged.sum() > 0.4 * x8.sum()  # the half is replaced, the rest kept
    assert set(stats[half]) == {"nr", "fr"} and set(measured["clean"][half]) == {"nr"}  # FR against the clean part
    rows = rq.score_photo(measured, sv.load_thresholds())
    keyed = [r for r in rows if r["damage"] == "gaussian blur" and r["kind"] == "is"]
    assert sorted((r["half"], r["key"]) for r in keyed) == sorted([(half, True), (rq.OPPOSITE[half], False)])
    assert len({r["whole_yes"] for r in keyed}) == 1  # the whole image gives the one answer to both
    assert [r["part_yes"] for r in sorted(keyed, key=lambda r: not r["key"])] == [True, False]  # chelsea, level 4
    assert [r["part_fr_yes"] for r in sorted(keyed, key=lambda r: not r["key"])] == [True, False]
    (which,) = [r for r in rows if r["kind"] == "which" and r["damage"] == "gaussian blur"]
    assert which["half"] == half and which["part_yes"] and which["part_fr_yes"]  # the blurred half is named
    assert len([r for r in rows if r["damage"] == "clean" and r["kind"] == "is"]) == 2 * len(rq.HALVES)
    # The same question is asked of the whole image, keyed Yes on the half-damaged image and No on the clean photo,
    # with the whole image's scores beside it (with the reference only for the damaged image).
    image = {(r["damage"], r["asked_about"]): r for r in rows if r["kind"] == "image"}
    assert set(image) == {("clean", "gaussian blur"), ("clean", "white noise"), ("gaussian blur", "gaussian blur"),
                          ("white noise", "white noise")}
    assert [image[k]["key"] for k in sorted(image)] == [False, False, True, True]
    assert image["white noise", "white noise"]["score_fr"] is not None and image["clean", "white noise"]["score_fr"] is None
    assert not image["clean", "white noise"]["whole_yes"]
    summary = rq.summarize(rows)
    assert summary["per_damage"]["gaussian blur"]["part"]["balanced"] == 1.0
    assert summary["per_damage"]["gaussian blur"]["whole"]["balanced"] == 0.5
    assert summary["which_half_right"]["n"] == 2 and summary["which_half_right"]["per_damage"]["gaussian blur"]["part"] == 1.0
    shares = summary["image_question"]["white noise"]
    assert shares["n"] == 1 and shares["clean_yes"] == 0.0 and shares["score_clean"] == image["clean", "white noise"]["score"]
