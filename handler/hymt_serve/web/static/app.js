// The translation page: language pickers, streamed output, readable errors. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { maxChars: 0, busy: false, streamEvents: 0, demoModel: false, features: [] };
window.hymt = state; // read by the browser tests

const MESSAGES = {
  same_language: "Source and target are the same language: pick two different ones.",
  unsupported_language: "This language pair is not supported.",
  payload_too_large: "The text is too long for the server.",
  server_busy: "The server is busy. Try again in a moment.",
  server_unavailable: "The translation server cannot be reached.",
  out_of_memory: "The server ran out of memory for this text. Try a shorter text.",
};

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
  if (state.features.includes("context") && $("context").value.trim()) {
    body.context = $("context").value;
  }
  return body;
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
  state.busy = true;
  state.streamEvents = 0;
  $("translate").disabled = true;
  const started = performance.now();
  try {
    const response = await fetch("/api/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const reply = await response.json().catch(() => ({}));
      return showError(readableError(response.status, reply));
    }
    const final = await readStream(response);
    const seconds = (performance.now() - started) / 1000;
    const tokens = final && final.usage ? final.usage.output_tokens : 0;
    $("stats").textContent = `${seconds.toFixed(2)} s · ${(tokens / seconds).toFixed(1)} tokens/s`;
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
      if ("delta" in message) {
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
  const config = await fetch("/api/config").then((r) => r.json());
  state.maxChars = config.max_chars;
  $("model").textContent = config.model;
  state.demoModel = config.demo_model === true;
  $("demo-notice").hidden = !state.demoModel;
  state.features = Array.isArray(config.features) ? config.features : [];
  $("glossary-field").hidden = !state.features.includes("glossary");
  $("context-field").hidden = !state.features.includes("context");
  $("options").hidden = state.features.length === 0;
  fillLanguages(config.languages);
  updateCount();
  $("input").addEventListener("input", updateCount);
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) translate();
  });
  $("translate").addEventListener("click", translate);
  $("swap").addEventListener("click", swap);
  $("copy").addEventListener("click", copyOutput);
  state.ready = true;
}

init().catch(() => showError(MESSAGES.server_unavailable));
