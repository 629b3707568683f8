//! What hosts tell each other, and where: each host listens on a sharded pub/sub channel
//! of its own for the notices, chat and broadcasts meant for its users. Only the format
//! lives here; publishing and subscribing are in `delivery` and `store`.

use serde::{Deserialize, Serialize};

/// Messages between hosts, on each host's sharded pub/sub channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Mesh {
    Notice {
        user: u64,
        notice: hongbao_money::Notice,
    },
    Chat {
        from: u64,
        to: u64,
        text: String,
    },
    Broadcast {
        server_time_us: u64,
        text: String,
    },
}

pub(crate) fn channel(host: &str) -> String {
    format!("hb:host:{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_messages_read_back() {
        let m = Mesh::Chat {
            from: 1,
            to: 2,
            text: "hi".into(),
        };
        let back: Mesh = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert!(matches!(back, Mesh::Chat { from: 1, to: 2, .. }));
    }
}
