//! A sent packet's gate in Redis (`gate.lua`), in front of PostgreSQL: an open Redis can
//! refuse by itself (not a recipient, no share left) costs the ledger nothing. The ledger
//! still holds every rule, so a gate lost in a failover only costs it work.

use hongbao_proto::ResultCode;

use crate::store::Store;

impl Store {
    /// The packet's gate: `Some(refusal)` when Redis can refuse the open by itself.
    pub async fn gate(&self, packet: u64, user: u64) -> Option<ResultCode> {
        let mut redis = self.redis();
        let answer: Result<String, _> = self
            .0
            .gate
            .key(format!("{{pk:{packet}}}"))
            .arg(user)
            .invoke_async(&mut redis)
            .await;
        match answer.as_deref() {
            Ok("pass") | Err(_) => None,
            Ok(name) => ResultCode::from_name(name),
        }
    }

    /// A sent packet's gate, once PostgreSQL holds the packet.
    pub(crate) async fn open_gate(
        &self,
        packet: u64,
        shares: usize,
        recipients: &[u64],
        ttl_ms: u64,
    ) {
        let key = format!("{{pk:{packet}}}");
        let secs = (ttl_ms / 1000 + 60) as i64;
        // MULTI/EXEC: a replica taking over has all of the gate or none of it (a gate
        // with `left` but no recipients would refuse every recipient).
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset(&key, "left", shares)
            .ignore()
            .sadd(format!("{key}:r"), recipients)
            .ignore()
            .expire(&key, secs)
            .ignore()
            .expire(format!("{key}:r"), secs)
            .ignore()
            .expire(format!("{key}:o"), secs)
            .ignore();
        let _ = self.transaction(&pipe, &key).await;
    }
}
