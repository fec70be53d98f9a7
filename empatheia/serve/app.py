"""The HTTP API and the page of ``empatheia serve``, on FastAPI.

``create_app(model)`` builds the application around a model that is already loaded: it
stays in memory and answers every session's turns on one thread (:class:`ModelWorker`).
The API is documented by its OpenAPI schema (``/openapi.json``); every error is JSON,
``{"error": "<field>: <what was wrong>", "field": "<field>"}``, with a status that says
what kind of error it is (see :class:`~empatheia.serve.uploads.UploadError`; 503 busy).
"""

import io
import json
import queue
import secrets
import tempfile
import zipfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional

import cv2
from fastapi import FastAPI, File, Form, Query, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..dialogue import Turn
from ..errors import DataError
from ..generators.avatars import avatar_key
from ..generators.base import Avatar
from ..media import write_wav
from .conversation import BUILTIN_PROFILES, TURN_FILES, TurnUpdate
from .sessions import Busy, ModelWorker, Session, SessionStore
from .uploads import UploadError, UploadLimits, check_size, check_text, decode_audio, decode_image, decode_video

STATIC = Path(__file__).with_name("static")
TURN_TIMEOUT = 900.0
"""Seconds a request waits for its turn's next part before giving up (the turn goes on)."""


# ---------------------------------------------------------------------- schema
class Prediction(BaseModel):
    label: str
    probabilities: Dict[str, float]


class AvatarInfo(BaseModel):
    key: str
    profile: Dict[str, str]
    portrait_url: str
    custom: bool = Field(False, description="registered by this session (portrait and voice uploaded)")


class SessionInfo(BaseModel):
    session_id: str = Field(description="random id; every later request of this conversation names it")
    avatar: AvatarInfo


class TurnResult(BaseModel):
    """One answer, or with ``stream=true`` one line per part of it as it becomes ready."""

    session_id: str
    turn: int = Field(description="1 for the session's first answered turn")
    stage: Literal["text", "speech", "video", "done"] = Field(
        description="what is ready: text (text, chain, emotions), speech (audio_url), video (video_url), "
                    "done (every file; the turn is part of the conversation)")
    text: str
    chain_of_empathy: Dict[str, Any] = Field(
        description="event_scenario, speaker_emotion, emotion_cause, goal_to_response, raw, parsed")
    emotion: Prediction = Field(description="the Style Disentangler's class (fused with the chain's emotion where "
                                            "the model config says so), which styles the voice and face")
    chain_emotion: Optional[Prediction] = Field(None, description="the speaker's emotion as the chain weighs it")
    style_agreement: Optional[str] = None
    avatar: Optional[str] = None
    voice_style: Optional[Dict[str, Any]] = None
    face_style: Optional[Dict[str, Any]] = None
    audio_url: Optional[str] = Field(None, description="response.wav, once stage is speech or later")
    video_url: Optional[str] = Field(None, description="response.mp4 (H.264 + AAC), once stage is video or later")
    page_url: Optional[str] = Field(None, description="the turn's index.html, once done")
    files_url: Optional[str] = Field(None, description="a zip of the turn's files, once done")
    seconds: Dict[str, float] = Field(description="seconds from the start of the turn to the end of each stage")


class ErrorBody(BaseModel):
    error: str = Field(description="what was wrong, starting with the field")
    field: Optional[str] = None


_ERRORS = {status: {"model": ErrorBody} for status in (400, 404, 413, 415, 422, 500, 503, 504)}


# ---------------------------------------------------------------------- limits
class _LimitBody:
    """Refuses a request body over ``max_bytes`` before it is parsed or stored: by its
    Content-Length, or, for a body sent without one, by counting it as it arrives and
    cutting it off at the limit (the application sees the client go, and its answer to
    that is replaced by the 413)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def refusal(self, size: Optional[int] = None) -> JSONResponse:
        size = f"{size / 2**20:.1f} MiB, " if size is not None else ""
        return _error(413, None, f"the request is {size}over the {self.max_bytes / 2**20:.0f} MiB limit")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self.refusal(int(length))(scope, receive, send)
        seen, over = 0, False

        async def counted():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def unless_over(message):
            if not over:
                await send(message)

        try:
            await self.app(scope, counted, unless_over)
        except Exception:
            if not over:
                raise
        if over:
            await self.refusal()(scope, receive, send)


def _error(status: int, field: Optional[str], message: str, headers: Optional[dict] = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


# ---------------------------------------------------------------------- the app
def create_app(
    model,
    root: Optional[Path] = None,
    limits: UploadLimits = UploadLimits(),
    max_pending: int = 16,
    session_ttl: float = 3600.0,
    max_sessions: int = 100,
    max_turns: int = 7,
    max_new_tokens: Optional[int] = None,
) -> FastAPI:
    """The application around ``model`` (an :class:`~empatheia.Empatheia`, loaded).

    Args:
        root: folder for the sessions' files (default: a new temporary folder, removed
            when the application stops).
        limits: what uploads may be.
        max_pending: turns that may wait for the model; more are answered 503 busy.
        session_ttl: seconds of idleness after which a session and its files go.
        max_sessions: sessions kept at once (a new one pushes out the longest idle).
        max_turns: turns of a conversation the model reads (the window).
        max_new_tokens: the language model's limit per answer (default: the config's).
    """
    owned_root = root is None
    store = SessionStore(Path(tempfile.mkdtemp(prefix="empatheia-serve-")) if owned_root else Path(root),
                         ttl=session_ttl, max_sessions=max_sessions, max_turns=max_turns)
    model.generators()
    registry = model.avatars()
    builtin = {avatar_key(p): p for p in BUILTIN_PROFILES}
    portraits = {key: _png(registry.for_profile(profile).portrait) for key, profile in builtin.items()}
    worker = ModelWorker(model, store, max_pending=max_pending, max_new_tokens=max_new_tokens)
    sample_rate = model.config.speech_encoder.sample_rate
    frame_rate = model.config.video_encoder.frame_rate
    profile_values = model.config.style_disentangler.profile_labels

    @asynccontextmanager
    async def lifespan(app):
        yield
        worker.close()
        if owned_root:
            store.close()

    app = FastAPI(
        title="empatheia",
        summary="Talk to an empathetic avatar: text, voice and face in; text, Chain of Empathy, voice and face out.",
        version="0.1.0",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.store, app.state.worker, app.state.limits = store, worker, limits
    app.add_middleware(_LimitBody, max_bytes=2 * limits.max_bytes + 2**20)

    # ------------------------------------------------------------------ errors
    @app.exception_handler(UploadError)
    async def upload_error(request, error: UploadError):
        return _error(error.status, error.field, str(error))

    @app.exception_handler(Busy)
    async def busy(request, error: Busy):
        return _error(503, None, str(error), {"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request, error: RequestValidationError):
        problem = error.errors()[0]
        field = str(problem["loc"][-1]) if problem.get("loc") else None
        message = problem.get("msg", "invalid")
        if "UploadFile" in message:
            message = "expected a file upload (multipart/form-data); a path or other text is not read"
        return _error(422, field, f"{field}: {message}" if field else message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error: StarletteHTTPException):
        return _error(error.status_code, None, str(error.detail))

    @app.exception_handler(Exception)
    async def internal(request, error: Exception):
        return _error(500, None, f"internal error: {type(error).__name__}: {error}")

    # ------------------------------------------------------------------ helpers
    def avatar_info(session: Optional[Session], key: Optional[str] = None) -> AvatarInfo:
        if session is not None and session.conversation.avatar is not None:
            avatar = session.conversation.avatar
            return AvatarInfo(key=avatar.key, profile=avatar.profile, custom=True,
                              portrait_url=f"/api/sessions/{session.id}/avatar.png")
        if key is None:
            key = avatar_key(session.conversation.listener_profile)
        return AvatarInfo(key=key, profile=builtin[key], portrait_url=f"/api/avatars/{key}/portrait.png")

    def upload_bytes(field: str, upload: UploadFile) -> None:
        check_size(field, upload.size if upload.size is not None else len(upload.file.read()), limits)

    def result(session: Session, update: TurnUpdate) -> dict:
        record = update.record
        base = f"/api/sessions/{session.id}/turns/{update.number}"
        reached = ("text", "speech", "video", "done").index(update.stage)
        done = update.stage == "done"
        return TurnResult(
            session_id=session.id, turn=update.number, stage=update.stage, text=record["text"],
            chain_of_empathy=record["chain_of_empathy"], emotion=record["emotion"],
            chain_emotion=record["chain_emotion"], style_agreement=record["style_agreement"],
            avatar=record["avatar"], voice_style=record["voice_style"], face_style=record["face_style"],
            audio_url=f"{base}/response.wav" if record["audio"] and reached >= 1 else None,
            video_url=f"{base}/response.mp4" if record["video"] and reached >= 2 else None,
            page_url=f"{base}/index.html" if done else None,
            files_url=f"{base}/files.zip" if done else None,
            seconds=update.seconds,
        ).model_dump()

    def turn_failed(error: Exception) -> JSONResponse:
        if isinstance(error, queue.Empty):
            return _error(504, None, f"no answer within {TURN_TIMEOUT:.0f} s; the turn goes on in its session")
        if isinstance(error, Busy):
            return _error(503, None, str(error))
        if isinstance(error, DataError):
            field = next((m for m in ("audio", "video") if (error.field or "").endswith(m)), error.field)
            return _error(422, field, f"{field}: {error.reason}" if field else error.reason)
        return _error(500, None, f"the model failed on this turn: {type(error).__name__}: {error}")

    # ------------------------------------------------------------------ routes
    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/health")
    def health() -> dict:
        """The server is up: the model's preset, the sessions and the turns waiting."""
        return {"status": "ok", "preset": model.config.preset, "sessions": len(store), "waiting": worker.waiting}

    @app.get("/api/avatars", response_model=List[AvatarInfo])
    def avatars():
        """The avatars to pick from."""
        return [avatar_info(None, key) for key in builtin]

    @app.get("/api/avatars/{key}/portrait.png", response_class=Response)
    def builtin_portrait(key: str):
        if key not in builtin:
            raise UploadError("key", "no such avatar", 404)
        return Response(portraits[key], media_type="image/png")

    @app.post("/api/sessions", response_model=SessionInfo)
    def new_session(avatar: Optional[str] = Form(None, description="a key from /api/avatars")):
        """Start a conversation."""
        session = store.create()
        if avatar is not None:
            pick(session, avatar)
        return SessionInfo(session_id=session.id, avatar=avatar_info(session))

    @app.delete("/api/sessions/{session_id}")
    def end_session(session_id: str) -> dict:
        """End a conversation and remove its files."""
        store.delete(session_id)
        return {"deleted": True}

    @app.post("/api/sessions/{session_id}/reset", response_model=SessionInfo)
    def reset(session_id: str):
        """Start the conversation over (same session, same avatar; earlier files stay)."""
        session = store.get(session_id)
        session.conversation.reset()
        return SessionInfo(session_id=session.id, avatar=avatar_info(session))

    def pick(session: Session, key: str) -> None:
        if key not in builtin:
            raise UploadError("avatar", f"no such avatar; one of {sorted(builtin)}", 404)
        session.conversation.avatar = None
        session.conversation.listener_profile = dict(builtin[key])

    @app.post("/api/sessions/{session_id}/avatar", response_model=AvatarInfo)
    def choose_avatar(
        session_id: str,
        avatar: Optional[str] = Form(None, description="pick: a key from /api/avatars"),
        portrait: Optional[UploadFile] = File(None, description="register: a face picture (PNG, JPEG...)"),
        voice: Optional[UploadFile] = File(None, description="register: a clip of the voice to speak with"),
        age: Optional[str] = Form(None),
        gender: Optional[str] = Form(None),
        timbre: Optional[str] = Form(None),
    ):
        """Pick an avatar, or register this session's own: a portrait, and optionally a
        voice clip whose pitch, formants and rate the voice takes on, and a profile."""
        from ..generators.avatar_face import fit_portrait

        session = store.get(session_id)
        if (avatar is None) == (portrait is None):
            raise UploadError("avatar", "give either avatar (a key to pick) or portrait (a picture to register)")
        if avatar is not None:
            pick(session, avatar)
            return avatar_info(session)
        profile = {}
        for name, value in (("age", age), ("gender", gender), ("timbre", timbre)):
            if value:
                if value not in profile_values.get(name, ()):
                    raise UploadError(name, f"{value!r} is not one of {list(profile_values.get(name, ()))}")
                profile[name] = value
        upload_bytes("portrait", portrait)
        portrait.file.seek(0)
        image = fit_portrait(decode_image("portrait", portrait.file.read(), limits))
        voice_name = "auto"
        if voice is not None:
            upload_bytes("voice", voice)
            clip = decode_audio("voice", voice.file, sample_rate, limits)
            path = session.conversation.folder / f"voice-{secrets.token_hex(4)}.wav"
            write_wav(path, _tensor(clip.samples), clip.sample_rate)
            voice_name = str(path)
        session.conversation.avatar = Avatar(key=f"custom-{secrets.token_hex(4)}", portrait=image,
                                             voice=voice_name, profile=profile)
        session.conversation.listener_profile = profile
        return avatar_info(session)

    @app.get("/api/sessions/{session_id}/avatar.png", response_class=Response)
    def session_portrait(session_id: str):
        session = store.get(session_id)
        if session.conversation.avatar is None:
            return Response(portraits[avatar_key(session.conversation.listener_profile)], media_type="image/png")
        return Response(_png(session.conversation.avatar.portrait), media_type="image/png")

    @app.post("/api/turns", response_model=TurnResult)
    def post_turn(
        session_id: Optional[str] = Form(None, description="from POST /api/sessions; without it a session is made"),
        text: str = Form("", description="what the user says"),
        audio: Optional[UploadFile] = File(None, description="the user's voice (WAV, FLAC, MP3, Ogg, WebM...)"),
        video: Optional[UploadFile] = File(None, description="the user's face (MP4, WebM, MOV...)"),
        speak: bool = Form(True, description="answer with a voice too"),
        animate: bool = Form(True, description="answer with a talking head too (speaks too)"),
        stream: bool = Query(False, description="answer as NDJSON, one TurnResult line per stage as it is ready"),
    ):
        """Send the user's turn (text, and or a recording of their voice and face) and get
        the answer. Each part is checked before the model sees it."""
        session = store.get(session_id) if session_id else None
        worker.ensure_room()
        text = check_text(text, limits)
        voice = face = None
        if audio is not None:
            upload_bytes("audio", audio)
            voice = decode_audio("audio", audio.file, sample_rate, limits)
        if video is not None:
            upload_bytes("video", video)
            face = decode_video("video", video.file, frame_rate, limits)
        if not text and voice is None and face is None:
            raise UploadError("text", "a turn needs text, audio or video")
        session = session or store.create()
        turn = Turn("speaker", text, audio=None if voice is None else voice.samples,
                    sample_rate=None if voice is None else voice.sample_rate,
                    video=None if face is None else face.frames)
        job = worker.submit(session, turn, speak=speak, animate=animate)
        updates = job.updates(timeout=TURN_TIMEOUT)
        try:
            first = next(updates)
            if not stream:
                last = first
                for last in updates:
                    pass
                return JSONResponse(result(session, last))
        except Exception as error:
            return turn_failed(error)

        def lines():
            yield json.dumps(result(session, first)) + "\n"
            try:
                for update in updates:
                    yield json.dumps(result(session, update)) + "\n"
            except Exception as error:
                body = json.loads(turn_failed(error).body)
                yield json.dumps({"stage": "error", **body}) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get("/api/sessions/{session_id}/turns/{turn}/files.zip", response_class=Response)
    def turn_zip(session_id: str, turn: int):
        """Every file of an answered turn, zipped."""
        folder = turn_folder(session_id, turn)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name in TURN_FILES:
                if (folder / name).is_file():
                    archive.write(folder / name, f"turn-{turn}/{name}")
        return Response(buffer.getvalue(), media_type="application/zip",
                        headers={"Content-Disposition": f'attachment; filename="empatheia-turn-{turn}.zip"'})

    @app.get("/api/sessions/{session_id}/turns/{turn}/{name}", response_class=FileResponse)
    def turn_file(session_id: str, turn: int, name: Literal[TURN_FILES]):
        """One file of a turn: response.json, response.wav, response.mp4, index.html or
        features.safetensors."""
        path = turn_folder(session_id, turn) / name
        if not path.is_file():
            raise UploadError("name", f"turn {turn} has no {name} (not written yet, or not asked for)", 404)
        return FileResponse(path)

    def turn_folder(session_id: str, turn: int) -> Path:
        session = store.get(session_id)
        if not 1 <= turn <= session.conversation.answered + 1:
            raise UploadError("turn", f"this session has no turn {turn}", 404)
        return session.conversation.turn_folder(turn)

    return app


def _png(image) -> bytes:
    ok, data = cv2.imencode(".png", image[..., ::-1])
    return data.tobytes()


def _tensor(samples):
    import torch

    return torch.from_numpy(samples)
