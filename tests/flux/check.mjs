// node tests/flux/check.mjs FILE.flux [...]
// Checks Flux scripts with InfluxData's own Flux parser and type checker: the npm package
// @influxdata/flux-lsp-browser (pinned in package.json; `npm ci --prefix tests/flux` installs it).
// Prints one JSON line per file: {file, ok, syntax_ok, semantic_ok, errors: [{line, column, message}]}.
// Exits 1 when any file is invalid, 2 on a usage or installation problem.
// Error messages come from the package's language server (publishDiagnostics); load.mjs loads it.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { flux as bg } from "./load.mjs";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node tests/flux/check.mjs FILE.flux [...]");
  process.exit(2);
}

// The server logs through console.*: keep stdout for results only.
const print = (line) => process.stdout.write(line + "\n");
console.log = console.info = console.debug = () => {};

// The language server, for messages. Each file is opened under its own folder: files of one folder
// form one Flux package for the server (an `option task` in two files would be "reassigned").
const diagnostics = new Map();
const lsp = new bg.Lsp();
lsp.onMessage((raw) => {
  const msg = JSON.parse(raw);
  if (msg.method === "textDocument/publishDiagnostics") diagnostics.set(msg.params.uri, msg.params.diagnostics);
});
lsp.run();
const send = (obj) => lsp.send(JSON.stringify({ jsonrpc: "2.0", ...obj }));
await send({ id: 1, method: "initialize", params: { capabilities: {}, processId: null, rootUri: null } });
await send({ method: "initialized", params: {} });

let bad = 0;
for (const [i, file] of files.entries()) {
  const src = readFileSync(file, "utf8");
  const uri = `file:///check/${i}/main.flux`;
  await send({ method: "textDocument/didOpen", params: { textDocument: { uri, languageId: "flux", version: 1, text: src } } });
  const errors = (diagnostics.get(uri) || [])
    .filter((d) => d.severity === 1)
    .map((d) => ({ line: d.range.start.line + 1, column: d.range.start.character + 1, message: d.message }));
  await send({ method: "textDocument/didClose", params: { textDocument: { uri } } });
  const syntax = bg.is_valid_flux(src);
  let semantic;
  try {
    semantic = new bg.Flux(src).is_valid();
  } catch (e) {
    semantic = false;
    errors.push({ line: 0, column: 0, message: String(e) });
  }
  const ok = syntax === true && semantic === true && errors.length === 0;
  if (!ok) bad++;
  print(JSON.stringify({ file: resolve(file), ok, syntax_ok: syntax, semantic_ok: semantic, errors }));
}
process.exit(bad ? 1 : 0);
