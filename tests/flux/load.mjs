// The Flux compiler front end of @influxdata/flux-lsp-browser (pinned in package.json), loaded in Node.
//
// The package is built for bundlers (it imports its .wasm as an ES module), which Node cannot do, so
// the glue module is loaded from memory with that import replaced by a setter, and the .wasm is
// instantiated by hand. Exits 2 when the package is missing or not the pinned layout.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

let pkgDir;
try {
  pkgDir = createRequire(import.meta.url).resolve("@influxdata/flux-lsp-browser/package.json").replace(/package\.json$/, "");
} catch {
  console.error("@influxdata/flux-lsp-browser is not installed: run `npm ci --prefix tests/flux`");
  process.exit(2);
}

const glue = readFileSync(pkgDir + "flux-lsp-browser_bg.js", "utf8");
const patched = glue
  .replace(
    "import * as wasm from './flux-lsp-browser_bg.wasm';",
    "let wasm; export function __setWasm(w) { wasm = w; cachedInt32Memory0 = new Int32Array(wasm.memory.buffer); " +
      "cachedUint8Memory0 = new Uint8Array(wasm.memory.buffer); }",
  )
  .replace(/^cachedInt32Memory0 = new Int32Array\(wasm\.memory\.buffer\);$/m, "")
  .replace(/^cachedUint8Memory0 = new Uint8Array\(wasm\.memory\.buffer\);$/m, "");
if (patched === glue || !patched.includes("__setWasm")) {
  console.error("unexpected @influxdata/flux-lsp-browser layout: is the version the one package.json pins?");
  process.exit(2);
}
export const flux = await import("data:text/javascript;base64," + Buffer.from(patched).toString("base64"));
const { instance } = await WebAssembly.instantiate(readFileSync(pkgDir + "flux-lsp-browser_bg.wasm"), {
  "./flux-lsp-browser_bg.js": flux,
});
flux.__setWasm(instance.exports);
