"""The real HTTP path: DSPy's LM client talking to a local OpenAI-compatible server (127.0.0.1)."""
from __future__ import annotations

import base64
import io
import json
import re

import pytest

from canned import disable_dspy_cache, valid_reply, write_test_image
from fake_openai import FakeOpenAIServer, Reply, route_of, scripted

from agentic_iqa.api import Assessor
from agentic_iqa.config import load_settings
from agentic_iqa.fusion import ScoreFusion

LOGPROBS = {"A": -2.5, "B": -0.5, "C": -1.1, "D": -3.0, "E": -5.0}
SELECT_PIQE = {"selected_tools": {"Global": {"Blurs": "PIQE", "Noise": "PIQE"}}}
SELECT_FR = {"selected_tools": {"Global": {"Blurs": "SSIM", "Noise": "PSNR"}}}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    disable_dspy_cache()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("http")
    return write_test_image(d / "photo.jpg", size=(96, 72), quality=55), write_test_image(d / "ref.png", size=(96, 72), fmt="PNG")


def assessor(tmp_path, srv, **kw):
    s = load_settings(tmp_path, lm="openai/fake-vlm", api_base=srv.base_url, cache={"enabled": False}, **kw)
    for role in ("planner", "executor", "summarizer"):
        s.backends.role(role).num_retries = 2
        s.backends.role(role).timeout = 10
    return Assessor(s)


def scoring_routes(select=SELECT_PIQE, **extra):
    return {
        "plan": valid_reply("plan"), "detect": valid_reply("detect"), "analyze": valid_reply("analyze"),
        "select": select, "score": valid_reply("score", level="B"), "_logprobs": LOGPROBS, **extra,
    }


def test_nr_scoring_over_http_sends_original_bytes_and_fuses_logprobs(tmp_path, images):
    img, _ = images
    with FakeOpenAIServer(scripted(scoring_routes())) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate the quality of this photo")
    bodies = [r["body"] for r in srv.requests]
    assert sorted(route_of(b) for b in bodies) == ["analyze", "detect", "plan", "score", "select"]
    # The image arrives as an image_url data URL holding the file's own bytes.
    parts = [p for b in bodies for m in b["messages"] if isinstance(m.get("content"), list) for p in m["content"]]
    urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
    assert urls and all(u.startswith("data:image/jpeg;base64,") for u in urls)
    assert base64.b64decode(urls[0].split(",", 1)[1]) == img.read_bytes()
    # Log-probs were requested from the summarizer and drive the fused score.
    score_body = next(b for b in bodies if route_of(b) == "score")
    assert score_body.get("logprobs") is True and score_body.get("top_logprobs") == 5
    piqe = next(lg for lg in result.evidence.tool_logs if lg.ok)
    expected = ScoreFusion().fuse([piqe.normalized_score], level_logprobs=LOGPROBS)
    assert result.result.prob_mode == "logits"
    assert result.score == pytest.approx(expected.score, abs=1e-9)


def test_fr_scoring_over_http_uses_fr_tools(tmp_path, images):
    img, ref = images
    with FakeOpenAIServer(scripted(scoring_routes(select=SELECT_FR))) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate the quality of this photo", ref)
    assert result.plan.reference_mode == "Full-Reference"
    tools = {lg.tool_name for lg in result.evidence.tool_logs if lg.ok}
    assert tools == {"SSIM", "PSNR"}
    select_body = next(r["body"] for r in srv.requests if route_of(r["body"]) == "select")
    assert "Full-Reference" in json.dumps(select_body)


def test_mcq_over_http(tmp_path, images):
    img, _ = images
    routes = {
        "plan": valid_reply("plan", query_scope=["sky"], distortion_source="Explicit", distortions={"sky": ["Blurs"]},
                            plan={"distortion_detection": False, "distortion_analysis": True, "tool_selection": False, "tool_execution": False}),
        "analyze": {"distortion_analysis": {"sky": [{"type": "Blurs", "severity": "none", "explanation": "crisp"}]}},
        "explain": valid_reply("explain", final_answer="B"),
    }
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, "Is the sky blurry? A. Yes B. No")
    assert result.mode == "answer" and result.answer == "B" and result.lm_calls == 3


def test_replan_over_http(tmp_path, images):
    img, _ = images
    routes = scoring_routes(score=[valid_reply("score", level="C", need_replan=True, replan_reason="check the noise again"),
                                   valid_reply("score", level="B")])
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate this photo")
    plans = [r["body"] for r in srv.requests if route_of(r["body"]) == "plan"]
    assert result.replans == 1 and len(plans) == 2
    assert "check the noise again" in json.dumps(plans[1])


@pytest.mark.parametrize("status,headers", [(429, {"Retry-After": "0"}), (500, {})])
def test_transient_http_errors_are_retried(tmp_path, images, status, headers):
    img, _ = images
    routes = scoring_routes(plan=[Reply(status=status, headers=headers), valid_reply("plan")])
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate this photo")
    plans = [r for r in srv.requests if route_of(r["body"]) == "plan"]
    assert len(plans) == 2  # the failed call and its retry
    assert result.score is not None and not result.fallbacks


def _image_blocks(body: dict) -> list[tuple[str, str]]:
    """(the field header just before the image, its data URL) for every image in a request, in order."""
    out, header = [], None
    for m in body["messages"]:
        content = m.get("content")
        for part in content if isinstance(content, list) else [{"type": "text", "text": content or ""}]:
            if part.get("type") == "text":
                found = re.findall(r"\[\[ ## (\w+) ## \]\]", part.get("text") or "")
                header = found[-1] if found else header
            elif part.get("type") == "image_url":
                out.append((header, part["image_url"]["url"]))
    return out


def _system(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "system")


@pytest.mark.parametrize("query,final_route", [("Rate the quality of this photo", "score"),
                                               ("What is the main distortion? A. Blur B. Noise", "explain")])
def test_fr_shows_the_reference_image_labelled_where_the_prompts_compare(tmp_path, images, query, final_route):
    img, ref = images
    routes = scoring_routes(select=SELECT_FR, explain=valid_reply("explain", final_answer="A"))
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, query, ref)
    assert result.plan.reference_mode == "Full-Reference"
    by_route = {route_of(r["body"]): r["body"] for r in srv.requests}
    ref_url = "data:image/png;base64," + base64.b64encode(ref.read_bytes()).decode()
    img_url = "data:image/jpeg;base64," + base64.b64encode(img.read_bytes()).decode()
    for route in ("detect", "analyze", final_route):
        body = by_route[route]
        # Two images, in order, each under its own field: the distorted one first, then the reference.
        assert _image_blocks(body) == [("image", img_url), ("reference_image", ref_url)], route
        system = _system(body)
        assert "`image` (Image): the distorted image" in system, route
        assert "`reference_image` (Image): the reference image" in system, route
        assert "Compare the distorted image with the reference image" in system, route
    # The planner and tool selection do not compare the pair (reference_mode is decided by code).
    assert [u for _, u in _image_blocks(by_route["plan"])] == [img_url]
    assert _image_blocks(by_route["select"]) == []


def test_nr_sends_one_image_and_no_reference_field(tmp_path, images):
    img, _ = images
    with FakeOpenAIServer(scripted(scoring_routes())) as srv:
        assessor(tmp_path, srv).assess(img, "Rate the quality of this photo")
    for r in srv.requests:
        body = r["body"]
        if route_of(body) in ("detect", "analyze", "score"):
            assert [h for h, _ in _image_blocks(body)] == ["image"]
            assert "reference_image" not in json.dumps(body) and "distorted image" not in _system(body)


def test_fr_retry_keeps_the_reference(tmp_path, images):
    """A rejected FR reply is retried with the same two images (the retry builds on the FR prompt)."""
    img, ref = images
    routes = scoring_routes(select=SELECT_FR, detect=["not json at all", valid_reply("detect")])
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate the quality of this photo", ref)
    detects = [r["body"] for r in srv.requests if route_of(r["body"]) == "detect"]
    assert len(detects) == 2 and result.retries == 1
    assert [h for h, _ in _image_blocks(detects[1])] == ["image", "reference_image"]
    assert "previous reply was rejected" in _system(detects[1]) and "reference_image" in _system(detects[1])


def _sent_images(srv) -> list[tuple[str, bytes]]:
    """(MIME type, decoded bytes) of every image in every request the server received."""
    out = []
    for r in srv.requests:
        for _, url in _image_blocks(r["body"]):
            head, data = url.split(",", 1)
            out.append((head[len("data:"):].split(";")[0], base64.b64decode(data)))
    return out


@pytest.mark.parametrize("with_reference", [False, True])
def test_trace_states_the_image_bytes_sent(tmp_path, images, with_reference):
    img, ref = images
    # One rejected detection reply: its retry sends the image again, and that counts too.
    routes = scoring_routes(select=SELECT_FR if with_reference else SELECT_PIQE,
                            detect=["not json", valid_reply("detect")])
    with FakeOpenAIServer(scripted(routes)) as srv:
        result = assessor(tmp_path, srv).assess(img, "Rate the quality of this photo", ref if with_reference else None)
    sent = _sent_images(srv)
    assert result.image_bytes_sent == sum(len(b) for _, b in sent) > 0
    assert len(sent) == 5 + 4 * with_reference  # plan, detect ×2, analyze, score (+ the reference but for plan)
    calls = [e for e in result.trace if e.kind == "lm_call"]
    per_call = {e.stage: e.data["image_bytes"] for e in calls}
    assert per_call["select"] == 0 and per_call["planner"] == img.stat().st_size
    assert per_call["detect"] == img.stat().st_size + (ref.stat().st_size if with_reference else 0)
    assert f"{per_call['detect']:,} bytes per request" in next(e.message for e in calls if e.stage == "detect")


def test_jpeg_transport_sends_image_jpeg_and_the_trace_counts_it(tmp_path, images):
    from PIL import Image

    _, png = images  # a PNG: the default sends its bytes as they are, jpeg:80 a JPEG copy
    with FakeOpenAIServer(scripted(scoring_routes())) as srv:
        result = assessor(tmp_path, srv, image_transport="jpeg:80").assess(png, "Rate the quality of this photo")
    sent = _sent_images(srv)
    assert sent and {mime for mime, _ in sent} == {"image/jpeg"}
    assert result.image_bytes_sent == sum(len(b) for _, b in sent)
    decoded = Image.open(io.BytesIO(sent[0][1]))
    assert decoded.format == "JPEG" and decoded.size == Image.open(png).size
    assert any("re-encoded PNG" in n and "JPEG (quality 80)" in n and "image_transport: jpeg:80" in n for n in result.notes)
    tools = [lg for lg in result.evidence.tool_logs if lg.ok]
    assert tools  # the tools still read the PNG file itself


def test_side_transport_downscales_for_the_vlm_only(tmp_path, images):
    from PIL import Image

    img, _ = images  # 96×72
    with FakeOpenAIServer(scripted(scoring_routes())) as srv:
        result = assessor(tmp_path, srv, image_transport="side:64").assess(img, "Rate the quality of this photo")
    sent = _sent_images(srv)
    assert {Image.open(io.BytesIO(b)).size for _, b in sent} == {(64, 48)}
    assert {mime for mime, _ in sent} == {"image/png"}  # auto encoding: lossless below the provider limit
    assert result.image_bytes_sent == sum(len(b) for _, b in sent)
