//! The bench's requests to a server's admin API: each carries the server's admin key
//! (the operator key it made in its data directory, or the lab's).

/// A request to an admin API with the bench's admin key.
pub(crate) fn admin_request(method: &str, url: &str, key: &str) -> ureq::Request {
    hongbao_http::tls::agent_builder()
        .build()
        .request(method, url)
        .set("Authorization", &format!("Bearer {key}"))
}
