// Bundles the browser entry twice, each a single file with no imports:
//   dist/browser/hongbao-client.js       an ES module: <script type="module"> import { connect } from "…"
//   dist/browser/hongbao-client.iife.js  minified, a classic script defining `globalThis.hongbao`,
//                                        small enough to inline into a self-contained page
// platform: "browser" makes the build fail if anything Node-only ever leaks into the
// browser entry's imports.
import { build } from "esbuild";

const common = {
  entryPoints: ["src/index.ts"],
  bundle: true,
  platform: "browser",
  target: "es2020",
  logLevel: "warning",
};

await build({ ...common, outfile: "dist/browser/hongbao-client.js", format: "esm", sourcemap: true });
await build({ ...common, outfile: "dist/browser/hongbao-client.iife.js", format: "iife", globalName: "hongbao", minify: true });
