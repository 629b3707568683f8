/**
 * Throwaway certificates for the TLS tests, made with the `openssl` command: a CA, a
 * server certificate it signed for 127.0.0.1 (P-256, a day long), and a second CA that
 * signed nothing of the server's — what a client trusting the wrong CA holds. Written to
 * a temporary folder the caller removes.
 */

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface TestCerts {
  dir: string;
  /** The server's certificate and key (PEM files). */
  certPath: string;
  keyPath: string;
  /** The CA that signed it, as PEM text. */
  caPem: string;
  /** Another CA, which did not. */
  otherCaPem: string;
  remove(): void;
}

/** Why the TLS tests cannot run here, or false. */
export function noOpenssl(): string | false {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return false;
  } catch {
    return "no `openssl` command to make the test certificates with";
  }
}

export function makeCerts(): TestCerts {
  const dir = mkdtempSync(join(tmpdir(), "hongbao-ts-tls-"));
  const at = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  for (const ca of ["ca", "other-ca"]) {
    openssl("req", "-x509", ...ec, "-keyout", `${ca}.key`, "-out", `${ca}.pem`, "-days", "1",
      "-subj", `/CN=hongbao ${ca} for tests`,
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign");
  }
  openssl("req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1");
  writeFileSync(at("server.ext"),
    "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n");
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-out", "server.pem", "-days", "1", "-extfile", "server.ext");
  return {
    dir,
    certPath: at("server.pem"),
    keyPath: at("server.key"),
    caPem: readFileSync(at("ca.pem"), "utf8"),
    otherCaPem: readFileSync(at("other-ca.pem"), "utf8"),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
