"""The HTTP API of ``empatheia serve`` on a real server (tiny preset, loopback): answers,
streaming, concurrency without lost or mixed turns, refused uploads, busy, sessions."""

from __future__ import annotations

import http.client
import io
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile

from empatheia import Empatheia
from empatheia.serve.sessions import SessionStore

from .conftest import wav_bytes
from .serve_helpers import Server, mp4_bytes

TOKENS = 4  # short answers: the voice and face of each take a fraction of a second
TEXT_ONLY = {"speak": "false", "animate": "false"}


@pytest.fixture(scope="module")
def tiny():
    return Empatheia.from_preset("tiny")


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    server = Server(tiny, root=tmp_path_factory.mktemp("sessions"), max_new_tokens=TOKENS)
    yield server
    server.stop()


class Gated:
    """The tiny model, answering only once ``gate`` is set (or failing, with ``fail``):
    lets a test hold the model busy for as long as it needs."""

    def __init__(self, model):
        self.model, self.gate, self.fail = model, threading.Event(), False

    def __getattr__(self, name):
        return getattr(self.model, name)

    def respond_in_stages(self, *args, **kwargs):
        assert self.gate.wait(60)
        if self.fail:
            raise RuntimeError("the stand-in model failed on purpose")
        yield from self.model.respond_in_stages(*args, **kwargs)


def _wait(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ---------------------------------------------------------------------- answers
def test_a_turn_answers_with_text_chain_emotions_and_playable_media(server):
    reply = server.post("/api/turns", {"text": "I failed my driving test again."},
                        files={"audio": ("voice.wav", wav_bytes(1.0)), "video": ("face.mp4", mp4_bytes(Path(server.app.state.store.root)))})
    assert reply.status == 200, reply.body
    turn = reply.json()
    assert turn["stage"] == "done" and turn["turn"] == 1 and len(turn["session_id"]) >= 32
    assert isinstance(turn["text"], str)
    assert {"event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response"} <= set(turn["chain_of_empathy"])
    assert turn["emotion"]["label"] in turn["emotion"]["probabilities"]
    wav = server.get(turn["audio_url"])
    samples, rate = soundfile.read(io.BytesIO(wav.body))
    assert wav.status == 200 and samples.shape[0] / rate > 0
    mp4 = server.get(turn["video_url"])
    assert mp4.status == 200 and mp4.body[4:8] == b"ftyp"
    assert server.get(turn["page_url"]).body.startswith(b"<!doctype html>")
    archive = zipfile.ZipFile(io.BytesIO(server.get(turn["files_url"]).body))
    assert {"turn-1/response.json", "turn-1/response.wav", "turn-1/response.mp4"} <= set(archive.namelist())


def test_streaming_hands_over_text_then_voice_then_face(server):
    reply = server.post("/api/turns?stream=true", {"text": "My sister is getting married!"})
    assert reply.status == 200 and reply.headers["content-type"].startswith("application/x-ndjson")
    lines = reply.lines()
    assert [line["stage"] for line in lines] == ["text", "speech", "video", "done"]
    assert lines[0]["audio_url"] is None and lines[0]["video_url"] is None
    assert lines[1]["audio_url"] and lines[1]["video_url"] is None
    assert lines[2]["video_url"] and lines[3]["files_url"]
    assert len({line["text"] for line in lines}) == 1
    assert lines[0]["seconds"]["text"] <= lines[3]["seconds"]["done"]


def test_text_only_turns_have_no_media(server):
    turn = server.post("/api/turns", {"text": "Just text, please.", **TEXT_ONLY}).json()
    assert turn["audio_url"] is None and turn["video_url"] is None and turn["stage"] == "done"


def test_the_api_is_described_by_openapi(server):
    schema = server.get("/openapi.json").json()
    assert {"/api/turns", "/api/sessions", "/api/avatars"} <= set(schema["paths"])
    form = schema["paths"]["/api/turns"]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in form


def test_eight_concurrent_clients_three_turns_each_none_lost_or_mixed(server):
    def client(i):
        session = server.new_session()
        answers = []
        for j in range(3):
            reply = server.post("/api/turns", {"session_id": session, "text": f"client {i} says number {j}",
                                               **TEXT_ONLY})
            answers.append((reply.status, reply.json()))
        return session, answers

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client, range(8)))
    assert len({session for session, _ in results}) == 8
    for i, (session, answers) in enumerate(results):
        assert [status for status, _ in answers] == [200, 200, 200]
        assert [a["session_id"] for _, a in answers] == [session] * 3
        assert [a["turn"] for _, a in answers] == [1, 2, 3]
        # The third answer read this client's three turns and nobody else's.
        page = server.get(f"/api/sessions/{session}/turns/3/index.html").body.decode()
        assert all(f"client {i} says number {j}" in page for j in range(3))
        assert not any(f"client {k} says" in page for k in range(8) if k != i)


# ---------------------------------------------------------------------- refusals
def _hour_of_wav() -> bytes:
    # 8-bit samples at 4 kHz keep an hour (13.7 MiB) under the size limit, so the length is
    # what is refused.
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(4000 * 3600, np.float32), 4000, format="WAV", subtype="PCM_U8")
    return buffer.getvalue()


def _png() -> bytes:
    import cv2

    return cv2.imencode(".png", np.full((48, 48, 3), 127, np.uint8))[1].tobytes()


def _silence() -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(16000, np.float32), 16000, format="WAV")
    return buffer.getvalue()


BAD_UPLOADS = {
    "png named .mp4": ({}, {"video": ("clip.mp4", _png)}, 415, "video", "not a video"),
    "random bytes": ({}, {"audio": ("voice.wav", lambda: np.random.default_rng(1).bytes(4000))}, 422, "audio", "cannot be decoded"),
    "an hour of wav": ({}, {"audio": ("long.wav", _hour_of_wav)}, 413, "audio", "over the 30 s limit"),
    "over the size limit": ({}, {"audio": ("big.wav", lambda: bytes(16 * 2**20 + 1))}, 413, "audio", "over the 16 MiB limit"),
    "a path as the audio": ({"audio": "/etc/passwd"}, {}, 422, "audio", "expected a file upload"),
    "a path as the session": ({"session_id": "../../etc"}, {}, 404, "session_id", "no such session"),
    "silence": ({}, {"audio": ("quiet.wav", _silence)}, 422, "audio", "silent"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPLOADS))
def test_bad_uploads_get_a_clear_error_and_the_server_keeps_answering(server, case):
    fields, files, status, field, message = BAD_UPLOADS[case]
    reply = server.post("/api/turns", {"text": "hello", **fields}, {k: (name, make()) for k, (name, make) in files.items()})
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["field"] == field and message in body["error"] and body["error"].startswith(field)
    assert server.post("/api/turns", {"text": "still there?", **TEXT_ONLY}).status == 200


def test_a_body_over_the_request_limit_is_refused_before_it_is_read(server):
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/api/turns")
    connection.putheader("Content-Type", "multipart/form-data; boundary=x")
    connection.putheader("Content-Length", str(200 * 2**20))
    connection.endheaders()
    reply = connection.getresponse()
    assert reply.status == 413 and b"over the 33 MiB limit" in reply.read()
    connection.close()


def test_a_body_without_a_length_is_cut_off_at_the_request_limit(server):
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    head = b'--x\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n'
    body = [head, *(bytes(2**20) for _ in range(40))]
    connection.request("POST", "/api/turns", body=iter(body), encode_chunked=True,
                       headers={"Content-Type": "multipart/form-data; boundary=x", "Transfer-Encoding": "chunked"})
    reply = connection.getresponse()
    assert reply.status == 413 and b"over the 33 MiB limit" in reply.read()
    connection.close()
    assert server.post("/api/turns", {"text": "still there?", **TEXT_ONLY}).status == 200


def test_a_file_name_is_never_a_path(server, tmp_path):
    target = tmp_path / "planted.wav"
    reply = server.post("/api/turns", {"text": "hi", **TEXT_ONLY}, {"audio": (f"../../../..{target}", wav_bytes())})
    assert reply.status == 200 and not target.exists()


def test_unknown_files_and_turns_are_404_json(server):
    session = server.new_session()
    for path in (f"/api/sessions/{session}/turns/7/response.wav", f"/api/sessions/{session}/turns/1/response.wav",
                 "/api/sessions/not-a-session/turns/1/response.json", "/api/nowhere"):
        reply = server.get(path)
        assert reply.status == 404 and "error" in reply.json(), path
    assert server.get(f"/api/sessions/{session}/turns/1/..%2F..%2Fsecret").status in (404, 422)


# ---------------------------------------------------------------------- busy and failures
def test_past_the_queue_bound_requests_are_told_busy_and_then_served(tiny, tmp_path):
    gated = Gated(tiny)
    server = Server(gated, root=tmp_path / "sessions", max_pending=1, max_new_tokens=TOKENS)
    try:
        store, worker = server.app.state.store, server.app.state.worker
        results = []

        def post():
            results.append(server.post("/api/turns", {"text": "wait for me", **TEXT_ONLY}).status)

        first = threading.Thread(target=post)
        first.start()
        _wait(lambda: len(store) == 1 and worker.waiting == 0 and sum(s.pending for s in store._sessions.values()) == 1)
        second = threading.Thread(target=post)
        second.start()
        _wait(lambda: worker.waiting == 1)
        busy = server.post("/api/turns", {"text": "me too", **TEXT_ONLY})
        assert busy.status == 503 and busy.json()["error"].startswith("busy") and busy.headers["retry-after"]
        gated.gate.set()
        first.join(60)
        second.join(60)
        assert results == [200, 200]
        assert server.post("/api/turns", {"text": "now?", **TEXT_ONLY}).status == 200
    finally:
        gated.gate.set()
        server.stop()


def test_a_failing_turn_is_a_json_error_and_the_server_serves_on(tiny, tmp_path):
    gated = Gated(tiny)
    gated.gate.set()
    server = Server(gated, root=tmp_path / "sessions", max_new_tokens=TOKENS)
    try:
        gated.fail = True
        reply = server.post("/api/turns", {"text": "break", **TEXT_ONLY})
        assert reply.status == 500 and "failed on purpose" in reply.json()["error"]
        stream = server.post("/api/turns?stream=true", {"text": "break", **TEXT_ONLY})
        assert stream.status == 500 and "failed on purpose" in stream.json()["error"]
        gated.fail = False
        assert server.post("/api/turns", {"text": "fine", **TEXT_ONLY}).status == 200
    finally:
        server.stop()


# ---------------------------------------------------------------------- sessions and avatars
def test_sessions_are_random_separate_and_deleted_with_their_files(server):
    a, b = server.new_session(), server.new_session()
    assert a != b and len(a) >= 32
    turn = server.post("/api/turns", {"session_id": a, "text": "mine", **TEXT_ONLY}).json()
    folder = server.app.state.store.get(a).conversation.folder
    assert (folder / "turn-1" / "response.json").is_file()
    # b's id does not open a's files.
    assert server.get(turn["page_url"].replace(a, b)).status == 404
    assert server.request("DELETE", f"/api/sessions/{a}").status == 200
    assert not folder.exists() and server.get(turn["page_url"]).status == 404


def test_reset_starts_the_dialogue_over(server):
    session = server.new_session()
    server.post("/api/turns", {"session_id": session, "text": "first words", **TEXT_ONLY})
    assert server.post(f"/api/sessions/{session}/reset").status == 200
    turn = server.post("/api/turns", {"session_id": session, "text": "second words", **TEXT_ONLY}).json()
    page = server.get(turn["page_url"]).body.decode()
    assert turn["turn"] == 2 and "second words" in page and "first words" not in page


def test_idle_sessions_expire_with_their_files(tmp_path):
    now = [0.0]
    store = SessionStore(tmp_path, ttl=60, clock=lambda: now[0])
    old = store.create()
    now[0] = 30
    kept = store.create()
    now[0] = 80
    assert store.sweep() == 1
    assert not old.conversation.folder.exists() and kept.conversation.folder.exists()
    with pytest.raises(ValueError, match="no such session"):
        store.get(old.id)
    store.mark(kept, +1)  # a turn in progress keeps a session alive
    now[0] = 1000
    assert store.sweep() == 0
    store.mark(kept, -1)  # the turn ends: the session was last used now
    assert store.sweep() == 0
    now[0] = 1061
    assert store.sweep() == 1


def test_the_longest_idle_session_makes_room(tmp_path):
    now = [0.0]
    store = SessionStore(tmp_path, max_sessions=2, clock=lambda: now[0])
    first = store.create()
    now[0] = 1
    second = store.create()
    now[0] = 2
    store.get(first.id)  # used again: second is now the longest idle
    store.create()
    assert len(store) == 2 and not second.conversation.folder.exists() and first.conversation.folder.exists()


def test_pick_or_register_an_avatar(server):
    avatars = server.get("/api/avatars").json()
    assert len(avatars) >= 2 and all(server.get(a["portrait_url"]).body[:4] == b"\x89PNG" for a in avatars)
    session = server.new_session()
    picked = server.post(f"/api/sessions/{session}/avatar", {"avatar": avatars[1]["key"]}).json()
    assert picked.get("key") == avatars[1]["key"], picked
    turn = server.post("/api/turns", {"session_id": session, "text": "hi", "speak": "true", "animate": "false"}).json()
    assert turn["avatar"] == avatars[1]["key"]

    registered = server.post(f"/api/sessions/{session}/avatar", {"gender": "male", "age": "elderly"},
                             {"portrait": ("me.png", _png()), "voice": ("me.wav", wav_bytes(2.0))})
    assert registered.status == 200, registered.body
    mine = registered.json()
    assert mine["custom"] and mine["profile"] == {"age": "elderly", "gender": "male"}
    assert server.get(mine["portrait_url"]).body[:4] == b"\x89PNG"
    turn = server.post("/api/turns", {"session_id": session, "text": "hello again"}).json()
    assert turn["avatar"] == mine["key"] and turn["video_url"]
    # Another session does not see it.
    assert mine["key"] not in {a["key"] for a in server.get("/api/avatars").json()}

    bad = server.post(f"/api/sessions/{session}/avatar", {}, {"portrait": ("me.png", b"not an image")})
    assert bad.status == 422 and bad.json()["field"] == "portrait"
    unknown = server.post(f"/api/sessions/{session}/avatar", {"avatar": "../../x"})
    assert unknown.status == 404 and unknown.json()["field"] == "avatar"
