// node tests/flux/ast.mjs < script.flux
// Prints the Flux parser's AST of the script on stdin as one JSON line (the same Rust parser, libflux,
// that InfluxDB's Go code calls through parser.ParseSource). Syntax errors are in the nodes' `errors`.
import { readFileSync } from "node:fs";
import { flux } from "./load.mjs";

console.log = console.info = console.debug = () => {};
process.stdout.write(JSON.stringify(flux.parse(readFileSync(0, "utf8"))) + "\n");
