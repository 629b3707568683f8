/**
 * A real `hongbao serve` for the tests: found, started on loopback with every address on
 * port 0 (the kernel picks free ports; the server's ready line says which), a temporary
 * data dir, stopped by pid at the end. Also the admin API calls the tests make.
 *
 * Its login key is the HS256 secret {@link TEST_SECRET}, handed over in `HONGBAO_SECRET`
 * (never on the command line, which every local user can read); tokens for it come from
 * `devToken(TEST_SECRET, user)`.
 *
 * The binary: `$HONGBAO_BIN` if set, else the newer of `<repo>/target/release/hongbao`
 * and `<repo>/target/debug/hongbao`; none → the tests that need it are skipped.
 *
 * With `tls` the server speaks TLS on every listener and the admin address
 * (`--tls-cert`, `--tls-key`): its URLs are `wss://` and `https://`, and the admin calls
 * here trust the given CA (over the library's `node:https` fetch: the global one takes
 * no CA).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import type { HttpFetch } from "../../src/client.js";
import { nodeHttpsFetch } from "../../src/node-http.js";
import { repoRoot } from "./repo.js";

export const TEST_SECRET = "hongbao-ts-client-test";

export function hongbaoBinary(): string | undefined {
  const fromEnv = process.env["HONGBAO_BIN"];
  if (fromEnv) return fromEnv;
  const candidates = ["release", "debug"]
    .map((profile) => join(repoRoot(), "target", profile, "hongbao"))
    .filter((path) => existsSync(path))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  return candidates[0];
}

export const NO_BINARY_MESSAGE =
  "no hongbao binary: set HONGBAO_BIN or build target/debug/hongbao (cargo build) to run the live tests";

export interface Server {
  pid: number;
  /** ws://127.0.0.1:PORT/ws (wss:// with TLS) */
  ws: string;
  /** http://127.0.0.1:PORT (the HTTP API; https:// with TLS) */
  http: string;
  /** http://127.0.0.1:PORT (the admin API; https:// with TLS) */
  admin: string;
  /** 127.0.0.1:PORT of the binary-frame listener */
  listen: string;
  /** What the server printed, for failure messages. */
  output(): string;
  /** The gateway worker processes now (children of the serve process). */
  workerPids(): number[];
  adminGet(path: string): Promise<any>;
  adminPost(path: string, body: unknown): Promise<any>;
  stop(): Promise<void>;
}

export interface ServeOptions {
  workers?: number;
  /** More `hongbao serve` flags. */
  args?: string[];
  /** TOML settings that have no flag (e.g. `max_unauthenticated = 1`). */
  config?: string;
  /** TLS on every listener: the certificate and key files, and the CA (PEM) that signed them. */
  tls?: { certPath: string; keyPath: string; caPem: string };
}

export async function startServer(options: ServeOptions = {}): Promise<Server> {
  const binary = hongbaoBinary();
  if (binary === undefined) throw new Error(NO_BINARY_MESSAGE);
  const dataDir = mkdtempSync(join(tmpdir(), "hongbao-ts-"));
  const args = [
    "serve",
    "--listen", "127.0.0.1:0",
    "--admin", "127.0.0.1:0",
    "--ws-listen", "127.0.0.1:0",
    "--http-listen", "127.0.0.1:0",
    "--data-dir", dataDir,
    "--workers", String(options.workers ?? 1),
    ...(options.tls ? ["--tls-cert", options.tls.certPath, "--tls-key", options.tls.keyPath] : []),
    ...(options.args ?? []),
  ];
  if (options.config !== undefined) {
    const configPath = join(dataDir, "hongbao.toml");
    writeFileSync(configPath, options.config);
    args.push("--config", configPath);
  }
  const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, HONGBAO_SECRET: TEST_SECRET } });
  let output = "";
  child.stdout!.on("data", (b: Buffer) => (output += b.toString()));
  child.stderr!.on("data", (b: Buffer) => (output += b.toString()));
  const ready = await waitForReady(child, () => output, 60_000);
  const address = (key: string) => {
    const m = new RegExp(`\\b${key}=(\\S+)`).exec(ready);
    if (!m) throw new Error(`no ${key}= in the ready line: ${ready}`);
    return m[1]!;
  };
  const [plain, secure] = options.tls ? ["https", "wss"] : ["http", "ws"];
  const globalFetch: HttpFetch = fetch;
  const fetchFn = options.tls ? nodeHttpsFetch(options.tls.caPem, globalFetch) : globalFetch;
  const admin = `${plain}://${address("admin")}`;
  // The operator key a fresh server makes in its data directory: the admin API needs it.
  const adminKey = readFileSync(join(dataDir, "admin.key"), "utf8").trim();
  const server: Server = {
    pid: child.pid!,
    ws: `${secure}://${address("ws")}/ws`,
    http: `${plain}://${address("http")}`,
    admin,
    listen: address("listen"),
    output: () => output,
    workerPids: () => childrenOf(child.pid!),
    adminGet: (path) => adminCall(fetchFn, admin, adminKey, "GET", path),
    adminPost: (path, body) => adminCall(fetchFn, admin, adminKey, "POST", path, body),
    stop: async () => {
      const workers = childrenOf(child.pid!);
      await stopProcess(child);
      // A supervisor that had to be killed may leave its workers: end those, by pid.
      for (const pid of workers) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
  await waitUntilAnswering(server, fetchFn);
  return server;
}

function waitForReady(child: ChildProcess, output: () => string, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(`no ready line within ${timeoutMs} ms`), timeoutMs);
    const fail = (why: string) => {
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(new Error(`hongbao serve: ${why}; it printed:\n${output()}`));
    };
    const look = () => {
      const line = output().split("\n").find((l) => l.startsWith("hongbao serve ready:"));
      if (line) {
        clearTimeout(timer);
        child.stdout!.off("data", look);
        resolve(line);
      }
    };
    child.stdout!.on("data", look);
    child.once("exit", (code) => fail(`exited with ${code} before it was ready`));
  });
}

/** The ready line comes once every worker has connected; check the HTTP API answers too. */
async function waitUntilAnswering(server: Server, fetchFn: HttpFetch): Promise<void> {
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetchFn(`${server.http}/v1/ping`, { method: "GET", headers: {} });
      if (r.status === 200) return;
    } catch {
      // not yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`hongbao serve does not answer on ${server.http}`);
}

/** Children of `pid`, from /proc/<pid>/task/<tid>/children. */
export function childrenOf(pid: number): number[] {
  const pids: number[] = [];
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const text = readFileSync(`/proc/${pid}/task/${tid}/children`, "utf8").trim();
      if (text) pids.push(...text.split(/\s+/).map(Number));
    }
  } catch {
    // the process is gone
  }
  return pids;
}

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

async function adminCall(
  fetchFn: HttpFetch,
  admin: string,
  key: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<any> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetchFn(admin + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (response.status < 200 || response.status > 299) throw new Error(`admin ${method} ${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}
