/**
 * A real `hongbao serve` for the tests: found, started on loopback with every address on
 * port 0 (the kernel picks free ports; the server's ready line says which), a temporary
 * data dir, stopped by pid at the end. Also the admin API calls the tests make.
 *
 * The binary: `$HONGBAO_BIN` if set, else the newer of `<repo>/target/release/hongbao`
 * and `<repo>/target/debug/hongbao`; none → the tests that need it are skipped.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

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
  /** ws://127.0.0.1:PORT/ws */
  ws: string;
  /** http://127.0.0.1:PORT (the HTTP API) */
  http: string;
  /** http://127.0.0.1:PORT (the admin API) */
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
    "--secret", TEST_SECRET,
    ...(options.args ?? []),
  ];
  if (options.config !== undefined) {
    const configPath = join(dataDir, "hongbao.toml");
    writeFileSync(configPath, options.config);
    args.push("--config", configPath);
  }
  const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout!.on("data", (b: Buffer) => (output += b.toString()));
  child.stderr!.on("data", (b: Buffer) => (output += b.toString()));
  const ready = await waitForReady(child, () => output, 60_000);
  const address = (key: string) => {
    const m = new RegExp(`\\b${key}=(\\S+)`).exec(ready);
    if (!m) throw new Error(`no ${key}= in the ready line: ${ready}`);
    return m[1]!;
  };
  const admin = `http://${address("admin")}`;
  // The operator key a fresh server makes in its data directory: the admin API needs it.
  const adminKey = readFileSync(join(dataDir, "admin.key"), "utf8").trim();
  const server: Server = {
    pid: child.pid!,
    ws: `ws://${address("ws")}/ws`,
    http: `http://${address("http")}`,
    admin,
    listen: address("listen"),
    output: () => output,
    workerPids: () => childrenOf(child.pid!),
    adminGet: (path) => adminCall(admin, adminKey, "GET", path),
    adminPost: (path, body) => adminCall(admin, adminKey, "POST", path, body),
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
  await waitUntilAnswering(server);
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
async function waitUntilAnswering(server: Server): Promise<void> {
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`${server.http}/v1/ping`);
      if (r.ok) return;
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
  admin: string,
  key: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<any> {
  const headers: Record<string, string> = { authorization: `Bearer ${key}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(admin + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`admin ${method} ${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}
