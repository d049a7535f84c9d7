// The translation page: language pickers, streamed output, readable errors. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  maxChars: 0, busy: false, streamEvents: 0, demoModel: false, features: [], refine: false,
  maxDocumentBytes: 0, maxOfficeBytes: 0, progress: [],
  names: {}, // each language's label in the pickers, by code
  detected: null, // the code the server detected for the last translation ("Detect language")
};
// The source picker's first choice: the server detects each text's language (source_lang auto).
const AUTO = "auto";
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
  $("source").add(new Option("Detect language · 检测语言", AUTO));
  for (const select of [$("source"), $("target")]) {
    for (const lang of languages) {
      state.names[lang.code] = `${lang.english} · ${lang.chinese} (${lang.code})`;
      select.add(new Option(state.names[lang.code], lang.code));
    }
  }
  $("source").value = AUTO;
  $("target").value = "en";
  updateSwap();
}

// What the server detected for a translation with source "auto": the reply's `detected`
// ({language, confidence}; null when it could not tell); `undefined` hides the line.
function showDetected(found) {
  state.detected = found && found.language ? found.language : null;
  const line = $("detected");
  line.hidden = found === undefined;
  if (found === null) {
    line.textContent = "Could not detect the source language: translated without naming it.";
  } else if (found) {
    line.textContent = `Detected: ${state.names[found.language] || found.language}`;
  }
  updateSwap();
}

// Swapping needs a source language to become the target: with "Detect language" that is the
// detected one, so the button waits for a detection.
function updateSwap() {
  const waiting = $("source").value === AUTO && !state.detected;
  $("swap").disabled = waiting;
  $("swap").title = waiting ? "Swap languages (once the source language is detected)"
    : "Swap languages";
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
  showDetected(undefined);
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
    // A stream's last line is the whole reply: `detected` is there as in a whole answer.
    if (body.source_lang === AUTO && final && "detected" in final) showDetected(final.detected);
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

function swap() {
  const source = $("source").value === AUTO ? state.detected : $("source").value;
  if (!source) return; // nothing detected yet: the button is disabled
  $("source").value = $("target").value;
  $("target").value = source;
  showDetected(undefined);
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
  state.maxOfficeBytes = config.max_office_bytes;
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
  $("source").addEventListener("change", () => showDetected(undefined));
  $("copy").addEventListener("click", copyOutput);
  setUpFiles();
  state.ready = true;
}

init().catch(() => showError(MESSAGES.server_unavailable));
