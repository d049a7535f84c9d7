// Whole files on the translation page: a dropped or chosen file translated as a document,
// its progress shown, the result offered for download. Loaded before app.js, whose helpers
// ($, state, requestBody, readStream, ...) it calls once the page is set up.
"use strict";

// File extensions and the document formats of the API.
const FORMATS = { txt: "text", text: "text", md: "markdown", markdown: "markdown", html: "html",
  htm: "html", srt: "srt", xlf: "xliff", xliff: "xliff", po: "po", docx: "docx", pptx: "pptx",
  xlsx: "xlsx" };
const OOXML = "application/vnd.openxmlformats-officedocument.";
const MIME = { text: "text/plain", markdown: "text/markdown", html: "text/html",
  srt: "application/x-subrip", xliff: "application/xliff+xml", po: "text/x-gettext-translation",
  docx: OOXML + "wordprocessingml.document", pptx: OOXML + "presentationml.presentation",
  xlsx: OOXML + "spreadsheetml.sheet" };
// Office files travel in base64 (the API's form for them), up to the handler's max_office_bytes
// (state.maxOfficeBytes, from /api/config).
const BINARY = new Set(["docx", "pptx", "xlsx"]);

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 32768) { // in chunks: no call with a million arguments
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 32768));
  }
  return btoa(binary);
}

function fromBase64(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
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
  if (!format) {
    return showError("Choose a .txt, .md, .html, .srt, .xlf, .po, .docx, .pptx or .xlsx file " +
      `(not "${file.name}").`);
  }
  const maxBytes = BINARY.has(format) ? state.maxOfficeBytes : state.maxDocumentBytes;
  if (file.size > maxBytes) {
    const limit = (maxBytes / 1048576).toFixed(1);
    return showError(`The file is larger than the server accepts (${limit} MB).`);
  }
  let text;
  try { // the file's own bytes: a byte-order mark is kept, anything but UTF-8 refused
    text = BINARY.has(format) ? toBase64(await file.arrayBuffer())
      : new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(await file.arrayBuffer());
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
    const content = BINARY.has(format) ? fromBase64(final.document) : final.document;
    link.href = URL.createObjectURL(new Blob([content], { type: MIME[format] }));
    link.download = name;
    link.textContent = `Download ${name}`;
    link.hidden = false;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const notes = [`${final.segments} segments in ${seconds} s`];
    const cut = (final.finish_reasons || {}).length;
    if (cut) notes.push(`${cut} cut at the length limit`);
    if (final.format_tags_lost) notes.push(`${final.format_tags_lost} formatting lost`);
    if (body.source_lang === AUTO && final.detected) {
      notes.push(`detected ${state.names[final.detected.language] || final.detected.language}`);
    }
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
