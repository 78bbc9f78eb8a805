// Builds the SDK: `node build.mjs <dir>` writes the minified ESM bundle
// `<dir>/notify-inbox.js` and its declarations (`<dir>/notify-inbox.d.ts`
// over `<dir>/types/`); `node build.mjs --tests <dir>` compiles the unit
// tests for `node --test`. Either first generates the edge's types,
// `src/generated/edge-api.ts`, from the OpenAPI document the edge serves
// (`docs/edge-openapi.json`, which a Rust test keeps equal to the code's),
// so the SDK is always typed by the edge it ships with. The output depends
// on the sources only (no times, no absolute paths), so check.sh can
// compare it byte for byte.
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";

const here = new URL(".", import.meta.url).pathname;
const args = process.argv.slice(2);
const tests = args[0] === "--tests";
const out = tests ? args[1] : args[0];
if (!out) {
  console.error("usage: node build.mjs [--tests] <output dir>");
  process.exit(2);
}

execFileSync(
  join(here, "node_modules/.bin/openapi-typescript"),
  [join(here, "../../docs/edge-openapi.json"), "-o", join(here, "src/generated/edge-api.ts")],
  { stdio: ["ignore", "ignore", "inherit"] },
);

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

if (tests) {
  const entryPoints = readdirSync(join(here, "test"))
    .filter((name) => name.endsWith(".test.ts"))
    .map((name) => join(here, "test", name));
  await build({
    entryPoints,
    outdir: out,
    outExtension: { ".js": ".mjs" },
    bundle: true,
    format: "esm",
    platform: "node",
    target: "node20",
    logLevel: "warning",
  });
} else {
  await build({
    entryPoints: [join(here, "src/index.ts")],
    outfile: join(out, "notify-inbox.js"),
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    charset: "utf8",
    legalComments: "none",
    logLevel: "warning",
  });
  execFileSync(
    join(here, "node_modules/.bin/tsc"),
    ["-p", join(here, "tsconfig.build.json"), "--outDir", join(out, "types")],
    { stdio: "inherit" },
  );
  writeFileSync(join(out, "notify-inbox.d.ts"), 'export * from "./types/index.js";\n');
}
