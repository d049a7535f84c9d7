// The translation page: language pickers, streamed output, readable errors. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  maxChars: 0, busy: false, streamEvents: 0, demoModel: false, features: [], refine: false,
  maxDocumentBytes: 0, progress: [],
};
// File extensions and the document formats of the API.
const FORMATS = { txt: "text", text: "text", md: "markdown", markdown: "markdown", html: "html",
  htm: "html", srt: "srt" };
const MIME = { text: "text/plain", markdown: "text/markdown", html: "text/html",
  srt: "application/x-subrip" };
// The option controls, by the request field each sets (shown when the model supports it).
const OPTIONS = ["glossary", "context", "preserve_format", "style", "preferences", "delimiters",
  "data_format"];
window.hymt = state; // read by the browser tests

const MESSAGES = {
  same_language: "Source and target are the same language: pick two different ones.",
  unsupported_language: "This language pair is not supported.",
  payload_too_large: "The text is too long for the server.",
  server_busy: "The server is busy. Try again in a moment.",
  server_unavailable: "The translation server cannot be reached.",
  unauthorized: "This server needs a client key: reload the page and enter one.",
  quota_exceeded: "The character limit of this key is reached.",
  too_many_requests: "Too many translations at once with this key. Try again in a moment.",
  out_of_memory: "The server ran out of memory for this text. Try a shorter text.",
};

// The client key, when the server asks for one (it listens beyond this machine): typed once,
// kept for this tab only, sent as "Authorization: Bearer <key>".
function authorized(headers = {}) {
  const key = sessionStorage.getItem("hymt-key");
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

function askForKey() {
  $("key-form").hidden = false;
  $("key").focus();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("hymt-key", $("key").value.trim());
    location.reload();
  }, { once: true });
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function updateCount() {
  const length = [...$("input").value].length;
  $("count").textContent = `${length} / ${state.maxChars} characters`;
  $("count").classList.toggle("over", length > state.maxChars);
}

function fillLanguages(languages) {
  for (const select of [$("source"), $("target")]) {
    for (const lang of languages) {
      const option = new Option(`${lang.english} · ${lang.chinese} (${lang.code})`, lang.code);
      select.add(option);
    }
  }
  $("source").value = "zh";
  $("target").value = "en";
}

function readableError(status, body) {
  const known = MESSAGES[body.error_type];
  if (body.error_type === "payload_too_large") {
    return `${known} ${body.error || ""} (allowed: ${body.allowed || "less"}).`;
  }
  if (known) return known;
  return body.error || `The server answered HTTP ${status}.`;
}

// The glossary box's "term = translation" lines as the API's pairs; null when a line is not one.
function glossaryPairs() {
  const pairs = [];
  for (const line of $("glossary").value.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    const source = line.slice(0, at).trim();
    const target = line.slice(at + 1).trim();
    if (at < 0 || !source || !target) return null;
    pairs.push({ source, target });
  }
  return pairs;
}

// The request body: the text and languages, plus the options the model supports and the user set.
function requestBody(text) {
  const body = { text, source_lang: $("source").value, target_lang: $("target").value };
  if (state.features.includes("glossary")) {
    const pairs = glossaryPairs();
    if (pairs === null) return null;
    if (pairs.length) body.glossary = pairs;
  }
  const has = (name) => state.features.includes(name);
  if (has("context") && $("context").value.trim()) body.context = $("context").value;
  if (has("preserve_format") && $("preserve_format").value) {
    body.preserve_format = $("preserve_format").value;
  }
  if (has("style") && $("style").value.trim()) body.style = $("style").value.trim();
  if (has("preferences")) {
    const lines = $("preferences").value.split("\n").map((l) => l.trim()).filter(Boolean);
    if (lines.length) body.preferences = lines;
  }
  if (has("delimiters") && $("delimiters").checked) body.delimiters = true;
  if (has("data_format") && $("data_format").value) body.data_format = $("data_format").value;
  // Formatted text comes back whole (its tags become markup at the end): no stream then.
  if (body.preserve_format) body.stream = false;
  return body;
}

function showCandidates(item) {
  const list = $("candidates");
  list.replaceChildren();
  const candidates = item && Array.isArray(item.candidates) ? item.candidates : [];
  for (const candidate of candidates) {
    const entry = document.createElement("li");
    entry.textContent = candidate;
    entry.dir = "auto";
    list.append(entry);
  }
  list.hidden = candidates.length === 0;
}

async function translate() {
  if (state.busy) return;
  const text = $("input").value;
  if (!text.trim()) return showError("Type or paste some text first.");
  const body = requestBody(text);
  if (body === null) return showError("Write each glossary line as: term = translation");
  showError("");
  $("output").textContent = "";
  $("stats").textContent = "";
  showCandidates(null);
  state.busy = true;
  state.streamEvents = 0;
  $("translate").disabled = true;
  const started = performance.now();
  const refine = state.refine && $("refine").checked;
  try {
    const response = await fetch(refine ? "/api/refine" : "/api/translate", {
      method: "POST",
      headers: authorized({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const reply = await response.json().catch(() => ({}));
      return showError(readableError(response.status, reply));
    }
    // A stream is newline-delimited JSON; a whole answer (refinement, formatted text) is JSON.
    const whole = (response.headers.get("Content-Type") || "").startsWith("application/json");
    const final = whole ? await response.json() : await readStream(response);
    if (whole && typeof final.translation === "string") $("output").textContent = final.translation;
    const seconds = (performance.now() - started) / 1000;
    const item = final && final.translations ? final.translations[0] : null;
    const notes = [`${seconds.toFixed(2)} s`];
    if (final && final.usage && !refine) {
      notes.push(`${(final.usage.output_tokens / seconds).toFixed(1)} tokens/s`);
    }
    if (item && item.finish_reason === "length") notes.push("cut at the length limit");
    if (item && item.format_tags_lost) notes.push(`${item.format_tags_lost} formatting lost`);
    if (refine && item) notes.push(item.refined ? "refined by Chimera" : "candidates agreed");
    $("stats").textContent = notes.join(" · ");
    if (refine) showCandidates(item);
    if (final && final.error) showError(readableError(200, final));
  } catch (error) {
    showError(MESSAGES.server_unavailable);
  } finally {
    state.busy = false;
    $("translate").disabled = false;
  }
}

async function readStream(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let last = null;
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const lines = buffer.split("\n");
    buffer = lines.pop();
    for (const line of lines) {
      if (!line.trim()) continue;
      const message = JSON.parse(line);
      if ("progress" in message) {
        showProgress(message.progress.done, message.progress.total);
      } else if ("delta" in message) {
        $("output").textContent += message.delta;
        state.streamEvents += 1;
      } else {
        last = message;
        if (typeof message.translation === "string") $("output").textContent = message.translation;
      }
    }
    if (done) return last;
  }
}

function showProgress(done, total) {
  state.progress.push(done);
  $("doc-progress").max = total;
  $("doc-progress").value = done;
  $("doc-status").textContent = `${done} / ${total} segments translated`;
}

// "notes.md" translated into German downloads as "notes.de.md".
function translatedName(name, language) {
  const dot = name.lastIndexOf(".");
  return dot > 0 ? `${name.slice(0, dot)}.${language}${name.slice(dot)}` : `${name}.${language}`;
}

async function translateFile(file) {
  if (state.busy || !file) return;
  const extension = file.name.includes(".") ? file.name.split(".").pop().toLowerCase() : "";
  const format = FORMATS[extension];
  if (!format) return showError(`Choose a .txt, .md, .html or .srt file (not "${file.name}").`);
  if (file.size > state.maxDocumentBytes) {
    const limit = (state.maxDocumentBytes / 1048576).toFixed(1);
    return showError(`The file is larger than the server accepts (${limit} MB).`);
  }
  let text;
  try { // the file's own bytes: a byte-order mark is kept, anything but UTF-8 refused
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })
      .decode(await file.arrayBuffer());
  } catch (error) {
    return showError("The file is not UTF-8 text.");
  }
  const body = requestBody(text);
  if (body === null) return showError("Write each glossary line as: term = translation");
  delete body.text;
  delete body.preserve_format; // a document keeps its format itself
  Object.assign(body, { document: text, format, stream: true });
  showError("");
  state.busy = true;
  state.progress = [];
  $("translate").disabled = $("pick").disabled = true;
  $("download").hidden = true;
  $("doc-progress").hidden = false;
  $("doc-progress").removeAttribute("value"); // busy until the first segments are done
  $("doc-status").textContent = `Splitting ${file.name}…`;
  const started = performance.now();
  try {
    const response = await fetch("/api/translate", {
      method: "POST",
      headers: authorized({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const reply = await response.json().catch(() => ({}));
      return fileFailed(readableError(response.status, reply));
    }
    const final = await readStream(response);
    if (!final || typeof final.document !== "string") {
      return fileFailed(readableError(200, final || {}));
    }
    const name = translatedName(file.name, $("target").value);
    const link = $("download");
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(new Blob([final.document], { type: MIME[format] }));
    link.download = name;
    link.textContent = `Download ${name}`;
    link.hidden = false;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const notes = [`${final.segments} segments in ${seconds} s`];
    const cut = (final.finish_reasons || {}).length;
    if (cut) notes.push(`${cut} cut at the length limit`);
    if (final.format_tags_lost) notes.push(`${final.format_tags_lost} formatting lost`);
    $("doc-status").textContent = notes.join(" · ");
    $("doc-progress").max = 1;
    $("doc-progress").value = 1;
  } catch (error) {
    fileFailed(MESSAGES.server_unavailable);
  } finally {
    state.busy = false;
    $("translate").disabled = $("pick").disabled = false;
  }
}

// A file that could not be translated: no progress bar left running, the reason shown.
function fileFailed(message) {
  $("doc-progress").hidden = true;
  $("doc-status").textContent = "";
  showError(message);
}

function setUpFiles() {
  const zone = $("document");
  $("pick").addEventListener("click", () => $("file").click());
  $("file").addEventListener("change", () => {
    translateFile($("file").files[0]);
    $("file").value = ""; // the same file can be chosen again
  });
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    translateFile(event.dataTransfer.files[0]);
  });
}

function swap() {
  const source = $("source").value;
  $("source").value = $("target").value;
  $("target").value = source;
  const output = $("output").textContent;
  if (output) {
    $("input").value = output;
    $("output").textContent = "";
    updateCount();
  }
}

async function copyOutput() {
  const text = $("output").textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (error) {
    const range = document.createRange();
    range.selectNodeContents($("output"));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    document.execCommand("copy");
  }
  $("copy").textContent = "Copied";
  setTimeout(() => ($("copy").textContent = "Copy"), 1200);
}

async function init() {
  const answer = await fetch("/api/config", { headers: authorized() });
  if (answer.status === 401) {
    sessionStorage.removeItem("hymt-key");
    return askForKey();
  }
  const config = await answer.json();
  state.maxChars = config.max_chars;
  state.maxDocumentBytes = config.max_document_bytes;
  $("model").textContent = config.family ? `${config.model} · ${config.family}` : config.model;
  state.demoModel = config.demo_model === true;
  $("demo-notice").hidden = !state.demoModel;
  state.features = Array.isArray(config.features) ? config.features : [];
  for (const name of OPTIONS) $(`${name}-field`).hidden = !state.features.includes(name);
  $("options").hidden = !OPTIONS.some((name) => state.features.includes(name));
  state.refine = config.refine === true;
  $("refine-field").hidden = !state.refine;
  fillLanguages(config.languages);
  updateCount();
  $("input").addEventListener("input", updateCount);
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) translate();
  });
  $("translate").addEventListener("click", translate);
  $("swap").addEventListener("click", swap);
  $("copy").addEventListener("click", copyOutput);
  setUpFiles();
  state.ready = true;
}

init().catch(() => showError(MESSAGES.server_unavailable));
