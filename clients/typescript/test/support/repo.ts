/**
 * Where the repository is, found from this file's own location (tests run from
 * `dist/test/`, sources live in `test/`): the first folder above that holds
 * `crates/proto/testdata/golden.txt`.
 */

import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "crates", "proto", "testdata", "golden.txt"))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error("no crates/proto/testdata/golden.txt above the test files");
    dir = up;
  }
}

/** The package folder (clients/typescript). */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json"))) dir = dirname(dir);
  return dir;
}
