// The page of `empatheia serve`: one conversation per tab, through the JSON API.
// Answers arrive as NDJSON (POST /api/turns?stream=true): each line is the turn so far,
// so the text and chain show first, then the voice, then the talking head.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { session: null, recording: null, audio: null, video: null, busy: false };
const CHAIN = [
  ["event_scenario", "Event scenario"],
  ["speaker_emotion", "Your emotion"],
  ["emotion_cause", "Its cause"],
  ["goal_to_response", "Goal of the answer"],
];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function status(message, isError = false) {
  $("status").textContent = message;
  $("status").classList.toggle("error", isError);
}

async function api(path, options = {}) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function showAvatar(info) {
  $("portrait").src = `${info.portrait_url}?v=${encodeURIComponent(info.key)}`;
  const select = $("avatar");
  if (info.custom && ![...select.options].some((o) => o.value === info.key)) {
    select.append(el("option", { value: info.key }, "your avatar"));
  }
  select.value = info.key;
}

async function startSession() {
  const body = new FormData();
  if ($("avatar").value && !$("avatar").value.startsWith("custom-")) body.append("avatar", $("avatar").value);
  const info = await api("/api/sessions", { method: "POST", body });
  state.session = info.session_id;
  showAvatar(info.avatar);
}

// ------------------------------------------------------------------ recording
async function toggleRecording() {
  if (state.recording) {
    state.recording.forEach((recorder) => recorder.stop());
    return;
  }
  const camera = $("use-camera").checked;
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true, video: camera });
  } catch (error) {
    status(`Cannot use the microphone${camera ? " or camera" : ""}: ${error.message}`, true);
    return;
  }
  const tracks = [["audio", stream.getAudioTracks()], ["video", stream.getVideoTracks()]];
  const started = performance.now();
  const recorders = [];
  let stopped = 0;
  for (const [kind, list] of tracks) {
    if (!list.length) continue;
    const chunks = [];
    const recorder = new MediaRecorder(new MediaStream(list));
    recorder.ondataavailable = (event) => event.data.size && chunks.push(event.data);
    recorder.onstop = () => {
      state[kind] = new File(chunks, `${kind}.webm`, { type: recorder.mimeType });
      if (++stopped === recorders.length) finishRecording(stream, (performance.now() - started) / 1000);
    };
    recorders.push(recorder);
  }
  if (camera) {
    $("preview").srcObject = stream;
    $("preview").hidden = false;
    $("preview").play().catch(() => {});
  }
  recorders.forEach((recorder) => recorder.start());
  state.recording = recorders;
  $("record").classList.add("recording");
  $("record").textContent = "■ Stop recording";
  status("Recording… press stop when you are done.");
}

function finishRecording(stream, seconds) {
  stream.getTracks().forEach((track) => track.stop());
  state.recording = null;
  $("preview").hidden = true;
  $("preview").srcObject = null;
  $("record").classList.remove("recording");
  $("record").textContent = "● Record voice and face";
  describeAttachments(`recorded ${seconds.toFixed(1)} s`);
  status("Recorded: press Send (add text if you like).");
}

function describeAttachments(how = "") {
  const parts = [];
  if (state.audio) parts.push("voice");
  else if ($("audio-file").files[0]) parts.push(`voice (${$("audio-file").files[0].name})`);
  if (state.video) parts.push("face");
  else if ($("video-file").files[0]) parts.push(`face (${$("video-file").files[0].name})`);
  $("attached").textContent = parts.length ? `Attached: ${parts.join(" and ")}${how ? ` (${how})` : ""}` : "";
}

// ------------------------------------------------------------------ a turn
function userBubble(text, audio, video) {
  const bubble = el("div", { class: "turn user" }, el("div", { class: "role" }, "you"));
  if (text) bubble.append(el("div", {}, text));
  if (video) bubble.append(el("video", { src: URL.createObjectURL(video), controls: "", muted: "", playsinline: "" }));
  if (audio) bubble.append(el("audio", { src: URL.createObjectURL(audio), controls: "" }));
  $("log").append(bubble);
}

function avatarBubble() {
  const bubble = el("div", { class: "turn avatar" },
    el("div", { class: "role" }, "avatar"),
    el("div", { class: "pending" }, "thinking…"));
  $("log").append(bubble);
  bubble.scrollIntoView({ block: "end" });
  return bubble;
}

function percent(value) {
  return `${(100 * value).toFixed(0)} %`;
}

function showText(bubble, turn) {
  bubble.querySelector(".pending").remove();
  bubble.append(el("div", { class: "answer" }, turn.text || "(no words)"));
  const chain = el("dl", { class: "chain" });
  for (const [key, title] of CHAIN) {
    chain.append(el("dt", {}, title), el("dd", {}, turn.chain_of_empathy[key] || "(not stated)"));
  }
  bubble.append(el("details", { class: "chain-of-empathy", open: "" }, el("summary", {}, "Chain of Empathy"), chain));
  const read = turn.chain_emotion
    ? `The chain reads ${turn.chain_emotion.label} (${percent(turn.chain_emotion.probabilities[turn.chain_emotion.label])}); `
    : "";
  bubble.append(el("div", { class: "emotion" },
    `${read}the model's emotion, which sets the voice and face: ${turn.emotion.label} ` +
    `(${percent(turn.emotion.probabilities[turn.emotion.label])})`));
  const speaking = turn.stage === "text" && ($("speak").checked || $("animate").checked);
  bubble.append(el("div", { class: "pending" }, speaking ? "speaking…" : ""));
}

function play(media) {
  media.play().catch(() => {});
}

// What the face was given, and why it may differ from the emotion the model read: the
// listener meets some emotions with another expression (fear with a smile, anger with a soft sad face),
// as the training data's listeners do.
function describeFace(turn) {
  const face = turn.face_style;
  let text = `face shows ${face.emotion}`;
  if (face.intensity !== undefined && face.emotion !== "neutral") text += ` at intensity ${face.intensity.toFixed(2)}`;
  if (face.emotion !== turn.emotion.label) {
    text += ` — the expression the model learned an empathetic listener shows for ${turn.emotion.label}`;
  }
  return text;
}

function showTurn(bubble, turn) {
  if (!bubble.querySelector(".answer")) showText(bubble, turn);
  const pending = bubble.querySelector(".pending");
  if (turn.audio_url && !bubble.querySelector("audio")) {
    const audio = el("audio", { src: turn.audio_url, controls: "", preload: "auto" });
    bubble.insertBefore(audio, pending);
    if (pending) pending.textContent = $("animate").checked ? "animating the face…" : "";
    play(audio);
  }
  if (turn.face_style && !bubble.querySelector(".face-style")) {
    bubble.querySelector(".emotion").after(el("div", { class: "emotion face-style" }, describeFace(turn)));
  }
  if (turn.video_url && !bubble.querySelector("video")) {
    const video = el("video", { src: turn.video_url, controls: "", playsinline: "", preload: "auto" });
    bubble.insertBefore(video, bubble.querySelector("audio"));
    const audio = bubble.querySelector("audio");
    // The video carries the same voice: let the face speak it rather than both at once.
    if (audio && !audio.paused) audio.addEventListener("ended", () => play(video), { once: true });
    else play(video);
  }
  if (turn.stage === "done") {
    if (pending) pending.remove();
    bubble.append(el("div", { class: "files" },
      el("a", { href: turn.files_url, download: "" }, "download this turn's files"), " · ",
      el("a", { href: turn.page_url, target: "_blank" }, "its page"),
      ` · ${turn.seconds.done.toFixed(1)} s`));
  }
  bubble.scrollIntoView({ block: "end" });
}

async function readLines(response, onLine) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
}

async function send(event) {
  event.preventDefault();
  if (state.busy) return;
  if (state.recording) {
    status("Stop the recording first.", true);
    return;
  }
  const text = $("text").value.trim();
  const audio = state.audio || $("audio-file").files[0] || null;
  const video = state.video || $("video-file").files[0] || null;
  if (!text && !audio && !video) {
    status("Type something, or record or attach your voice or face.", true);
    return;
  }
  const body = new FormData();
  body.append("session_id", state.session);
  body.append("text", text);
  if (audio) body.append("audio", audio);
  if (video) body.append("video", video);
  body.append("speak", $("speak").checked || $("animate").checked);
  body.append("animate", $("animate").checked);
  state.busy = true;
  $("send").disabled = true;
  userBubble(text, audio, video);
  const bubble = avatarBubble();
  status("The avatar is answering…");
  try {
    const response = await fetch("/api/turns?stream=true", { method: "POST", body });
    if (!response.ok) {
      const problem = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
      throw new Error(problem.error);
    }
    await readLines(response, (turn) => {
      if (turn.stage === "error") throw new Error(turn.error);
      showTurn(bubble, turn);
    });
    $("text").value = "";
    $("audio-file").value = "";
    $("video-file").value = "";
    state.audio = state.video = null;
    describeAttachments();
    status("");
  } catch (error) {
    bubble.querySelector(".pending")?.remove();
    bubble.append(el("div", { class: "error" }, error.message));
    status(error.message, true);
  } finally {
    state.busy = false;
    $("send").disabled = false;
  }
}

// ------------------------------------------------------------------ avatars
async function loadAvatars() {
  const avatars = await api("/api/avatars");
  for (const avatar of avatars) {
    const p = avatar.profile;
    $("avatar").append(el("option", { value: avatar.key }, `${p.age} ${p.gender}, ${p.timbre} voice`));
  }
}

async function chooseAvatar() {
  if ($("avatar").value.startsWith("custom-")) return;
  const body = new FormData();
  body.append("avatar", $("avatar").value);
  try {
    showAvatar(await api(`/api/sessions/${state.session}/avatar`, { method: "POST", body }));
  } catch (error) {
    status(error.message, true);
  }
}

async function register(event) {
  event.preventDefault();
  const body = new FormData($("register-form"));
  if (!body.get("voice")?.size) body.delete("voice");
  for (const key of ["gender", "age", "timbre"]) if (!body.get(key)) body.delete(key);
  status("Registering the avatar…");
  try {
    showAvatar(await api(`/api/sessions/${state.session}/avatar`, { method: "POST", body }));
    $("register").open = false;
    status("Your avatar answers from now on.");
  } catch (error) {
    status(error.message, true);
  }
}

async function restart() {
  try {
    await api(`/api/sessions/${state.session}/reset`, { method: "POST" });
  } catch (error) {
    await startSession();  // the session expired: a new one
  }
  $("log").replaceChildren();
  status("A new conversation.");
}

async function main() {
  $("composer").addEventListener("submit", send);
  $("record").addEventListener("click", toggleRecording);
  $("avatar").addEventListener("change", chooseAvatar);
  $("register-form").addEventListener("submit", register);
  $("restart").addEventListener("click", restart);
  $("audio-file").addEventListener("change", () => { state.audio = null; describeAttachments(); });
  $("video-file").addEventListener("change", () => { state.video = null; describeAttachments(); });
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  try {
    await loadAvatars();
    await startSession();
    document.body.dataset.ready = "true";
  } catch (error) {
    status(`Cannot reach the server: ${error.message}`, true);
  }
}

main();
