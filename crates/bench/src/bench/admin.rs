//! The bench's requests to a server's admin API: each carries the server's admin key
//! (the operator key it made in its data directory, or the lab's).

use hongbao_server::stats::Stats;

/// A request to an admin API with the bench's admin key.
pub(crate) fn admin_request(method: &str, url: &str, key: &str) -> ureq::Request {
    hongbao_http::tls::agent_builder()
        .build()
        .request(method, url)
        .set("Authorization", &format!("Bearer {key}"))
}

/// `GET ADMIN/v1/stats`, within 5 s; `None` from a server that does not answer (killed or
/// stopped on purpose, or draining).
pub(crate) fn stats(admin: &str, key: &str) -> Option<Stats> {
    admin_request("GET", &format!("{admin}/v1/stats"), key)
        .timeout(std::time::Duration::from_secs(5))
        .call()
        .ok()
        .and_then(|r| r.into_json().ok())
}
