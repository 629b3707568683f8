//! The admin HTTP API of a running `hongbao serve` (docs/admin-api.md), as JSON, with an
//! admin key (the operator key a fresh server writes to `DATA_DIR/admin.key`, or another).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

/// The admin HTTP API of a running `hongbao serve`, as one key.
pub struct Admin {
    pub addr: SocketAddr,
    /// `None`: requests carry no key.
    key: Option<String>,
    agent: ureq::Agent,
}

impl Admin {
    pub fn new(addr: SocketAddr, key: Option<String>) -> Admin {
        Admin {
            addr,
            key,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(15))
                .build(),
        }
    }

    /// The same API as another key.
    pub fn with_key(&self, key: &str) -> Admin {
        Admin::new(self.addr, Some(key.to_string()))
    }

    /// The same API with no key at all.
    pub fn without_key(&self) -> Admin {
        Admin::new(self.addr, None)
    }

    /// This one's key.
    pub fn key(&self) -> String {
        self.key.clone().expect("an admin with a key")
    }

    /// Makes a key of `role` named `name` (as this one, an operator): the key.
    pub fn make_key(&self, name: &str, role: &str) -> String {
        let made = self.post("/v1/admin-keys", &json!({ "name": name, "role": role }));
        made["key"].as_str().expect("a key").to_string()
    }

    /// Any admin request: (status, body).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let (status, reply, _) = self.http_full(method, path, body, &[]);
        (status, reply)
    }

    /// Any admin request, with `headers` beside (or instead of) this one's key and the
    /// JSON content type a body gets: (status, body, the answer's headers).
    pub fn http_full(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, String, Vec<(String, String)>) {
        let url = format!("http://{}{path}", self.addr);
        let mut request = self.agent.request(method, &url);
        if let Some(key) = &self.key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        if body.is_some() {
            request = request.set("Content-Type", "application/json");
        }
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let result = match body {
            Some(body) => request.send_string(body),
            None => request.call(),
        };
        let (status, response) = match result {
            Ok(response) => (response.status(), response),
            Err(ureq::Error::Status(status, response)) => (status, response),
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let names = response.headers_names();
        let headers = names
            .iter()
            .filter_map(|n| Some((n.clone(), response.header(n)?.to_string())))
            .collect();
        (status, response.into_string().unwrap_or_default(), headers)
    }

    pub fn get(&self, path: &str) -> Value {
        let (status, body) = self.http("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    pub fn audit(&self) -> Value {
        let audit = self.get("/v1/audit");
        assert_eq!(audit["ok"], true, "the money does not add up: {audit:#}");
        audit
    }

    /// POST `body` as JSON; the status must be a success (2xx): the reply's JSON.
    pub fn post(&self, path: &str, body: &Value) -> Value {
        let (status, reply) = self.http("POST", path, Some(&body.to_string()));
        assert!(
            (200..300).contains(&status),
            "POST {path}: {status} {reply}"
        );
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("POST {path}: {e}: {reply}"))
    }

    pub fn stats(&self) -> Value {
        self.get("/v1/stats")
    }

    /// The stats' workers (those that have reported so far).
    pub fn stats_workers(&self) -> Vec<Value> {
        self.stats()["workers"]
            .as_array()
            .expect("stats.workers")
            .clone()
    }

    /// Starts a shake campaign of `packets` at `rate_per_sec`, each of `min..=max` cents;
    /// returns its id.
    pub fn shake_campaign(&self, packets: u32, rate_per_sec: u32, min: u64, max: u64) -> u64 {
        let body = json!({
            "packets": packets,
            "rate_per_sec": rate_per_sec,
            "amount_min": min,
            "amount_max": max,
        });
        let (status, reply) = self.http("POST", "/v1/campaigns/shake", Some(&body.to_string()));
        assert_eq!(status, 201, "creating a shake campaign: {reply}");
        let campaign: Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(campaign["kind"], "shake", "{campaign}");
        assert_eq!(campaign["packets"], packets, "{campaign}");
        campaign["id"].as_u64().unwrap()
    }

    /// A user's balance as the ledger holds it.
    pub fn balance(&self, user: u64) -> u64 {
        let view = self.get(&format!("/v1/users/{user}"));
        assert_eq!(view["user"], user);
        view["balance_cents"].as_u64().unwrap()
    }
}
